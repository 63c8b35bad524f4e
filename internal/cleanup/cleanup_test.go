package cleanup

import (
	"slices"
	"testing"
)

func TestStack(t *testing.T) {
	var got []int
	var s Stack
	for i := 1; i <= 3; i++ {
		s.Add(func() { got = append(got, i) })
	}
	s.Clean()
	if !slices.Equal(got, []int{3, 2, 1}) {
		t.Errorf("Clean ran %v, want [3 2 1]", got)
	}
	got = nil
	s.Add(func() { got = append(got, 9) })
	s.Release()
	s.Clean()
	if got != nil {
		t.Errorf("Clean after Release ran %v", got)
	}
	s.Add(func() { got = append(got, 7) })
	later := s.Take()
	s.Clean()
	later.Clean()
	if !slices.Equal(got, []int{7}) {
		t.Errorf("Take: ran %v, want [7]", got)
	}
}
