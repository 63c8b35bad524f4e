package container

import "testing"

func testResources(t *testing.T, e *isoEnv, main *Sandbox) {}
func testPrivilege(t *testing.T, e *isoEnv, main *Sandbox) {}
