package ratelimit

import (
	"math"
	"strconv"
	"strings"
)

// A tolerant parser for the subset of RFC 9651 structured fields that the
// rate-limit fields use: a list of items (or the dictionary members of the
// draft-07 form), each a bare item with parameters. A malformed member is
// skipped, not fatal: a destination that garbles one policy still announces
// the others. Everything is linear in the input and bounded in allocations
// (maxMembers), whatever the destination sends.

// maxMembers bounds the members read from one field across all its lines. A
// field with more is ignored as a whole: real fields list a handful of
// policies, and a hostile one must not cost an allocation per member.
const maxMembers = 32

type kind uint8

const (
	kindOther  kind = iota // boolean, byte sequence, inner list: read and ignored
	kindNumber             // integer or decimal
	kindString             // "quoted"
	kindToken              // bare token
)

type bareItem struct {
	kind kind
	num  float64 // kindNumber; may be negative; finite (huge values saturate)
	str  string  // kindString, kindToken
}

type param struct {
	key   string
	value bareItem
}

type member struct {
	key    string // dictionary key; "" for a list member
	value  bareItem
	params []param
}

// name is the member's policy name: its string or token value.
func (m member) name() string {
	if m.value.kind == kindString || m.value.kind == kindToken {
		return m.value.str
	}
	return ""
}

// number returns parameter key as a finite number ≥ 0.
func (m member) number(key string) (float64, bool) {
	for _, p := range m.params {
		if p.key == key {
			if p.value.kind == kindNumber && p.value.num >= 0 {
				return p.value.num, true
			}
			return 0, false
		}
	}
	return 0, false
}

// parseField parses every line of a field as one list (RFC 9110 §5.3: lines
// combine as if joined by commas). ok is false when the field is absent or
// has more than maxMembers members.
func parseField(lines []string) (members []member, ok bool) {
	for _, line := range lines {
		p := sfParser{s: line}
		for {
			p.skipOWS()
			if p.done() {
				break
			}
			m, good := p.member()
			if good {
				p.skipOWS()
				good = p.done() || p.peek() == ','
			}
			if !good {
				p.skipMember()
			}
			if !p.done() { // at ','
				p.i++
			}
			if good {
				if len(members) == maxMembers {
					return nil, false
				}
				members = append(members, m)
			}
		}
	}
	return members, len(members) > 0
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }

func (p *sfParser) skipOWS() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// skipMember moves to the next top-level comma (or the end), stepping over
// quoted strings so a comma inside one does not split a member.
func (p *sfParser) skipMember() {
	for !p.done() {
		switch p.s[p.i] {
		case ',':
			return
		case '"':
			p.i++
			for !p.done() && p.s[p.i] != '"' {
				if p.s[p.i] == '\\' {
					p.i++
				}
				p.i++
			}
		}
		p.i++
	}
}

func (p *sfParser) member() (member, bool) {
	var m member
	if p.done() {
		return m, false
	}
	if isKeyStart(p.peek()) {
		// A token followed by '=' is a dictionary member's key.
		start := p.i
		key := p.key()
		if !p.done() && p.peek() == '=' {
			p.i++
			m.key = key
		} else {
			p.i = start
		}
	}
	v, ok := p.itemOrInnerList()
	if !ok {
		return m, false
	}
	m.value = v
	m.params, ok = p.params()
	return m, ok
}

func (p *sfParser) itemOrInnerList() (bareItem, bool) {
	if !p.done() && p.peek() == '(' {
		p.i++
		for {
			p.skipOWS()
			if p.done() {
				return bareItem{}, false
			}
			if p.peek() == ')' {
				p.i++
				return bareItem{kind: kindOther}, true
			}
			if _, ok := p.bareItem(); !ok {
				return bareItem{}, false
			}
			if _, ok := p.params(); !ok {
				return bareItem{}, false
			}
		}
	}
	return p.bareItem()
}

func (p *sfParser) params() ([]param, bool) {
	var ps []param
	for !p.done() && p.peek() == ';' {
		p.i++
		for !p.done() && p.peek() == ' ' {
			p.i++
		}
		if p.done() || !isKeyStart(p.peek()) {
			return nil, false
		}
		pr := param{key: p.key(), value: bareItem{kind: kindOther}} // bare key: boolean true
		if !p.done() && p.peek() == '=' {
			p.i++
			v, ok := p.bareItem()
			if !ok {
				return nil, false
			}
			pr.value = v
		}
		if len(ps) == maxMembers {
			return nil, false
		}
		ps = append(ps, pr)
	}
	return ps, true
}

// key reads a key. RFC 9651 keys are lower case; upper case is accepted and
// folded, since nothing is ambiguous about "R=5".
func (p *sfParser) key() string {
	start := p.i
	for !p.done() && isKeyChar(p.peek()) {
		p.i++
	}
	return strings.ToLower(p.s[start:p.i])
}

func (p *sfParser) bareItem() (bareItem, bool) {
	if p.done() {
		return bareItem{}, false
	}
	c := p.peek()
	switch {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.quoted()
	case isAlpha(c) || c == '*':
		start := p.i
		for !p.done() && isTokenChar(p.peek()) {
			p.i++
		}
		return bareItem{kind: kindToken, str: p.s[start:p.i]}, true
	case c == ':': // byte sequence
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return bareItem{}, false
		}
		p.i += end + 2
		return bareItem{kind: kindOther}, true
	case c == '?': // boolean
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return bareItem{kind: kindOther}, true
		}
	}
	return bareItem{}, false
}

// number reads -?DIGITS[.DIGITS]. RFC 9651 caps integers at 15 digits; here
// longer numbers are read and saturate (to math.MaxFloat64), so that
// "r=99999999999999999999" means "plenty" rather than "absent".
func (p *sfParser) number() (bareItem, bool) {
	neg := p.peek() == '-'
	if neg {
		p.i++
	}
	end, ok := scanDecimal(p.s, p.i)
	if !ok {
		return bareItem{}, false
	}
	f := parseDecimal(p.s[p.i:end])
	p.i = end
	if neg {
		f = -f
	}
	return bareItem{kind: kindNumber, num: f}, true
}

func (p *sfParser) quoted() (bareItem, bool) {
	p.i++ // opening quote
	var b strings.Builder
	for !p.done() {
		c := p.peek()
		p.i++
		switch {
		case c == '"':
			return bareItem{kind: kindString, str: b.String()}, true
		case c == '\\':
			if p.done() || (p.peek() != '"' && p.peek() != '\\') {
				return bareItem{}, false
			}
			b.WriteByte(p.peek())
			p.i++
		case c < 0x20 || c > 0x7e:
			return bareItem{}, false
		default:
			b.WriteByte(c)
		}
	}
	return bareItem{}, false
}

// scanDecimal returns the end of DIGITS[.DIGITS] starting at i.
func scanDecimal(s string, i int) (end int, ok bool) {
	j := i
	for j < len(s) && isDigit(s[j]) {
		j++
	}
	if j == i {
		return i, false
	}
	if j < len(s) && s[j] == '.' {
		k := j + 1
		for k < len(s) && isDigit(s[k]) {
			k++
		}
		if k == j+1 {
			return i, false
		}
		j = k
	}
	return j, true
}

// parseDecimal converts text already checked by scanDecimal; a value too
// large for a float64 saturates to math.MaxFloat64.
func parseDecimal(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return math.MaxFloat64
	}
	return f
}

// plainNumber parses a whole header value that should be one non-negative
// decimal ("50", "0.125"), allowing surrounding whitespace and ignoring
// anything after a comma (a proxy that folds a repeated header into
// "50, 50"). No sign, exponent, NaN or Inf.
func plainNumber(v string) (float64, bool) {
	if i := strings.IndexByte(v, ','); i >= 0 {
		v = v[:i]
	}
	v = strings.Trim(v, " \t")
	end, ok := scanDecimal(v, 0)
	if !ok || end != len(v) {
		return 0, false
	}
	return parseDecimal(v), true
}

func isDigit(c byte) bool    { return '0' <= c && c <= '9' }
func isAlpha(c byte) bool    { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isKeyStart(c byte) bool { return isAlpha(c) || c == '*' }
func isKeyChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isTokenChar is RFC 9110 tchar plus ':' and '/' (RFC 9651 sf-token).
func isTokenChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
