// SPDX-License-Identifier: Apache-2.0

package handlers

import (
	"testing"

	"github.com/idemsvc/idemsvc/internal/api"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The API names each state as the contract spells it, both ways, and an
// unknown name maps to no state, which the store refuses.
func TestStateNames(t *testing.T) {
	for s, name := range map[statemachine.State]api.State{
		statemachine.StateInProgress: "in_progress",
		statemachine.StateCompleted:  "completed",
		statemachine.StateFailed:     "failed",
	} {
		if got := apiState(s); got != name {
			t.Errorf("apiState(%d) = %q, want %q", s, got, name)
		}
		if got := stateOf(name); got != s {
			t.Errorf("stateOf(%q) = %d, want %d", name, got, s)
		}
	}
	if got := stateOf("released"); got != 0 {
		t.Errorf("stateOf(released) = %d, want 0", got)
	}
}
