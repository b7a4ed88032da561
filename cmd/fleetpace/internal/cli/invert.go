package cli

import "strconv"

// invertedBool is a bool flag that sets the negation of what it is given
// into *p: a flag kept for an option whose sense flipped
// (--recorder-async-commit=false is --recorder-sync-commit).
type invertedBool struct{ p *bool }

func (b invertedBool) String() string {
	if b.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*b.p)
}

func (b invertedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.p = !v
	return nil
}

func (b invertedBool) Type() string { return "bool" }
