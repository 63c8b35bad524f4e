//go:build race

package function

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
