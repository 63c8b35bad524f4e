package layercache

import "context"

// Warm brings a stack's layers to where a sandbox can use them: fetched
// (for a lazily loaded layer: its metadata, its blob served and the
// chunks of its access profile prefetching) and mounted. It then lets
// them go; they stay until GC or eviction. A node warms a create's layers
// when the create arrives, before it waits for its turn to start, so that
// the fetch runs while it waits. A create that needs a layer being warmed
// joins the same fetch.
func (c *Cache) Warm(ctx context.Context, layers []Layer) error {
	hexes, err := c.checkStack(layers)
	if err != nil {
		return err
	}
	es, err := c.acquireLayers(ctx, layers, hexes)
	if err != nil {
		return err
	}
	c.releaseLayers(es)
	return nil
}
