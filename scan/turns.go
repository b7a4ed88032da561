package scan

import (
	"slices"
	"sort"
)

// Keys' turns within a platform (see dueRun): which of a platform's read
// sources are known to be in its turn order, and what to read next.

// turnOrder works out what is known of p's turn order (p.turn) and the
// least place of the selection's sources outside it (p.low).
func (p *platformStream) turnOrder() {
	p.turn, p.low = p.turn[:0], nil
	lower := func(r dueRow) {
		if p.low == nil || compareFair(r, *p.low) < 0 {
			p.low = &r
		}
	}
	full := func() bool {
		if len(p.turn) >= p.cap {
			p.turn, p.low = p.turn[:p.cap], nil
			return true
		}
		return false
	}
	if p.keysOpen {
		// The first turn is not complete: what is known is the heads read,
		// in order. Unread keys' heads come after the last key read; every
		// key's second source after its head.
		for _, k := range p.keys {
			p.turn = append(p.turn, k.rows[0])
		}
		if full() {
			return
		}
		lower(after(p.lastKey))
		for _, k := range p.keys {
			p.nextOf(k, 1, lower)
		}
		return
	}
	// Every key is known: whole turns, as far as every key's source of
	// that turn is known.
	complete := 0
	for t := 1; ; t++ {
		var round []dueRow
		known := true
		for _, k := range p.keys {
			switch {
			case t > k.cap:
			case t <= len(k.rows):
				round = append(round, k.rows[t-1])
			case k.open:
				known = false
			}
		}
		if !known || len(round) == 0 {
			break
		}
		slices.SortFunc(round, compareFair)
		p.turn = append(p.turn, round...)
		complete = t
		if full() {
			return
		}
	}
	for _, k := range p.keys {
		p.nextOf(k, min(complete, len(k.rows), k.cap), lower)
	}
}

// nextOf calls lower with the least place of k's sources after its first
// n, if it may have any within its cap.
func (p *platformStream) nextOf(k *keyStream, n int, lower func(dueRow)) {
	switch {
	case n >= k.cap:
	case n < len(k.rows):
		lower(k.rows[n])
	case k.open:
		lower(after(k.rows[len(k.rows)-1]))
	}
}

// schedule sets p's next read: more keys while its first turn is not
// complete, else the next sources of its keys, deep enough for about twice
// the turn order known (at least 4 more), within its cap.
func (p *platformStream) schedule() {
	if p.keysOpen {
		p.wantKeys = min(p.cap, max(3*p.keysRead, firstKeys))
		p.wantSrc = p.wantKeys
		return
	}
	target := min(p.cap, max(4*len(p.turn), len(p.turn)+8))
	// The smallest depth whose turns hold target sources, counting an open
	// key's unknown sources as there.
	count := func(depth int) int {
		n := 0
		for _, k := range p.keys {
			d := min(depth, k.cap)
			if !k.open {
				d = min(d, len(k.rows))
			}
			n += d
		}
		return n
	}
	depth := sort.Search(p.cap, func(d int) bool { return count(d+1) >= target }) + 1
	scheduled := false
	for _, k := range p.keys {
		if d := min(depth, k.cap); k.open && len(k.rows) < d {
			k.want, scheduled = d-len(k.rows), true
		}
	}
	if !scheduled {
		for _, k := range p.keys {
			if k.open {
				k.want = 1
			}
		}
	}
}
