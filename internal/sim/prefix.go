package sim

import (
	"bytes"
	"container/heap"
	"encoding/json"
	"slices"
	"strings"
)

// prefixCache stands in for SGLang's radix cache (docs/engines.md §14): the
// KV of a prompt prefix lives in the pool once, however many requests
// share it. Prompts are cut at message boundaries (prefixSeg); each cut is
// a node whose parent is the cut before it. Running requests lock the
// nodes of their prompt; unlocked nodes stay cached and are evicted, least
// recently used leaf first, only when the pool needs their room.
type prefixCache struct {
	nodes     map[uint64]*prefixNode
	used      int // tokens held by cached nodes, locked or not
	evictable int // tokens of nodes no running request holds
	clock     uint64
	// onInsert and onEvict, when set, see every node that joins or leaves
	// (the miss diagnosis, missdiag.go).
	onInsert, onEvict func(hash uint64)
}

type prefixNode struct {
	hash     uint64
	parent   *prefixNode
	tokens   int // this node's own tokens, beyond its parent's
	ref      int // running requests holding it
	children int
	lastUse  uint64
}

func newPrefixCache() prefixCache {
	return prefixCache{nodes: map[uint64]*prefixNode{}}
}

// match returns the longest cached prefix of segs: its deepest node and
// its token count, touching every node on the way.
func (c *prefixCache) match(segs []prefixSeg) (*prefixNode, int) {
	var last *prefixNode
	hit := 0
	c.clock++
	for _, s := range segs {
		n, ok := c.nodes[s.hash]
		if !ok {
			break
		}
		n.lastUse = c.clock
		last, hit = n, s.tokens
	}
	return last, hit
}

// insert adds the segments not yet cached below the matched prefix and
// returns the deepest node; the new nodes' tokens join used (unlocked).
func (c *prefixCache) insert(segs []prefixSeg) *prefixNode {
	var last *prefixNode
	prev := 0
	c.clock++
	for _, s := range segs {
		n, ok := c.nodes[s.hash]
		if !ok {
			n = &prefixNode{hash: s.hash, parent: last, tokens: max(s.tokens-prev, 0)}
			c.nodes[s.hash] = n
			if last != nil {
				last.children++
			}
			c.used += n.tokens
			c.evictable += n.tokens
			if c.onInsert != nil {
				c.onInsert(s.hash)
			}
		}
		n.lastUse = c.clock
		last, prev = n, s.tokens
	}
	return last
}

// lock and unlock pin or release the path from n to the root.
func (c *prefixCache) lock(n *prefixNode) {
	for ; n != nil; n = n.parent {
		if n.ref == 0 {
			c.evictable -= n.tokens
		}
		n.ref++
	}
}

func (c *prefixCache) unlock(n *prefixNode) {
	c.clock++
	for ; n != nil; n = n.parent {
		n.ref--
		if n.ref == 0 {
			c.evictable += n.tokens
		}
		n.lastUse = c.clock
	}
}

// unlockedOn is the unlocked tokens on the path from n to the root: what
// locking n takes out of the evictable count.
func unlockedOn(n *prefixNode) int {
	t := 0
	for ; n != nil; n = n.parent {
		if n.ref == 0 {
			t += n.tokens
		}
	}
	return t
}

// evict frees at least need tokens of unlocked leaves, oldest first (a
// parent becomes a leaf once its children are gone), and returns what it
// freed, which is less when too little is evictable.
func (c *prefixCache) evict(need int) int {
	if need <= 0 || c.evictable == 0 {
		return 0
	}
	h := leafHeap{}
	for _, n := range c.nodes {
		if n.ref == 0 && n.children == 0 {
			h = append(h, n)
		}
	}
	heap.Init(&h)
	freed := 0
	for freed < need && h.Len() > 0 {
		n := heap.Pop(&h).(*prefixNode)
		delete(c.nodes, n.hash)
		if c.onEvict != nil {
			c.onEvict(n.hash)
		}
		freed += n.tokens
		c.used -= n.tokens
		c.evictable -= n.tokens
		if p := n.parent; p != nil {
			p.children--
			if p.children == 0 && p.ref == 0 {
				heap.Push(&h, p)
			}
		}
	}
	return freed
}

// leafHeap orders evictable leaves by last use, oldest first.
type leafHeap []*prefixNode

func (h leafHeap) Len() int           { return len(h) }
func (h leafHeap) Less(i, j int) bool { return h[i].lastUse < h[j].lastUse }
func (h leafHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leafHeap) Push(x any)        { *h = append(*h, x.(*prefixNode)) }
func (h *leafHeap) Pop() any {
	old := *h
	n := old[len(old)-1]
	*h = old[:len(old)-1]
	return n
}

// cacheAnswer keeps a finished chat answer in the prefix cache as the
// next turn sends it back: the prompt followed by the assistant message.
// SGLang inserts a finished request's prompt and output tokens into its
// radix tree (cache_finished_req) and vLLM keeps the full blocks of both,
// so a conversation's next turn on the same server finds its previous
// answer cached, not only the turns before it. Only a plain answer is
// keyed (no reasoning, no tool call, no token ids asked for), since the
// next prompt renders those differently; its content is keyed as a client
// sends it back (a JSON string, HTML not escaped).
func (sc *scheduler) cacheAnswer(r *request) {
	if !sc.cfg.CacheAnswers || r.kind != kindChat || r.promptIDs != nil || r.plan.reasoning > 0 || r.plan.toolStart >= 0 ||
		len(r.prefixes) == 0 || r.emitted == 0 {
		return
	}
	var text strings.Builder
	for i := range r.emitted {
		text.WriteString(tokenText(r.seed, i))
	}
	var content bytes.Buffer
	enc := json.NewEncoder(&content)
	enc.SetEscapeHTML(false)
	enc.Encode(text.String()) // a string always encodes
	answer := bytes.TrimSuffix(content.Bytes(), []byte("\n"))
	last := r.prefixes[len(r.prefixes)-1]
	h := hasher{h: last.hash}
	h.add([]byte("assistant"))
	h.add(answer)
	h.add(nil) // no tool_calls
	segs := append(slices.Clip(r.prefixes), prefixSeg{h.h, last.tokens + estimateTokens(len(answer), sc.cfg.BytesPerToken) + 4})
	before := sc.cache.used
	sc.cache.insert(segs)
	if sc.diag != nil {
		sc.diag.noteAnswer(sc, last.hash, h.h, answer)
	}
	sc.used += sc.cache.used - before
	sc.evict(0)
}
