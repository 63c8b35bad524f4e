package container

import "testing"

func testPrivilege(t *testing.T, e *isoEnv, main *Sandbox) {}
