package store

import "strings"

// EachPage calls fn for every item of successive pages, in order, until a
// page shorter than size. page reads the page after a key (the zero key
// first) and returns the key of its last item, so no statement is open
// while fn runs and memory stays at one page.
func EachPage[T, K any](size int, page func(after K) ([]T, K, error), fn func(T) error) error {
	var after K
	for {
		items, last, err := page(after)
		if err != nil {
			return err
		}
		for _, it := range items {
			if err := fn(it); err != nil {
				return err
			}
		}
		if len(items) < size {
			return nil
		}
		after = last
	}
}

// SplitOrigin cuts "file:line" (or "file:row N") after its last ':', so a
// backend stores the file part once per file.
func SplitOrigin(origin string) (prefix, pos string) {
	i := strings.LastIndexByte(origin, ':')
	return origin[:i+1], origin[i+1:]
}
