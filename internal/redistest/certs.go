package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs are PEM files of a test PKI, made by NewCerts: a CA, a certificate
// it signs for a server (127.0.0.1, ::1, localhost and the DNS name given to
// NewCerts; usable by that server as a client too, as a Redis Cluster node
// is on its cluster bus), one for a client, and a second CA that signs
// nothing of these (a client trusting it verifies nothing here).
type Certs struct {
	CAFile                        string
	ServerCertFile, ServerKeyFile string
	ClientCertFile, ClientKeyFile string
	OtherCAFile                   string
	// ClientCertFile's and ClientKeyFile's pair, and a pool of CAFile.
	Client tls.Certificate
	Pool   *x509.CertPool
	// ServerName is the DNS name given to NewCerts.
	ServerName string
}

// NewCerts writes a fresh test PKI into dir (ECDSA P-256 keys, valid from an
// hour ago for a day).
func NewCerts(dir, dnsName string) (*Certs, error) {
	c := &Certs{
		CAFile: filepath.Join(dir, "ca.pem"), OtherCAFile: filepath.Join(dir, "other-ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"), ServerKeyFile: filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"), ClientKeyFile: filepath.Join(dir, "client-key.pem"),
		ServerName: dnsName,
	}
	ca, caKey, err := newCA("sluice test CA", c.CAFile, "")
	if err != nil {
		return nil, err
	}
	if _, _, err := newCA("sluice other test CA", c.OtherCAFile, ""); err != nil {
		return nil, err
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsName},
		DNSNames:    []string{dnsName, "localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := issue(server, ca, caKey, c.ServerCertFile, c.ServerKeyFile); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "sluice-test-client"},
		DNSNames:    []string{"sluice-test-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(client, ca, caKey, c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, err
	}
	if c.Client, err = tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, err
	}
	c.Pool = x509.NewCertPool()
	c.Pool.AddCert(ca)
	return c, nil
}

func serial() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)) }

func newCA(name, certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}

func issue(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if tmpl.SerialNumber, err = serial(); err != nil {
		return err
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return errors.Join(writePEM(certFile, "CERTIFICATE", der), writePEM(keyFile, "PRIVATE KEY", pk))
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
