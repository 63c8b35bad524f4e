package container

import "testing"

func testFileAPI(t *testing.T, e *isoEnv, main *Sandbox)   {}
func testResources(t *testing.T, e *isoEnv, main *Sandbox) {}
func testPrivilege(t *testing.T, e *isoEnv, main *Sandbox) {}
