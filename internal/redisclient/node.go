package redisclient

// NodeOf returns the address of the node the named cluster sends cmd to on
// the script path (the node owning the slot of its key, as last learnt), or
// "" when that is not known: an unknown cluster, a command that does not
// take the script path, no slot table yet. For log lines.
func (c *Clusters) NodeOf(name string, cmd []byte) string {
	b, err := c.binding(name)
	if err != nil {
		return ""
	}
	slot, ok := pipeSlot(cmd)
	if !ok {
		return ""
	}
	return b.router.addrOf(slot)
}
