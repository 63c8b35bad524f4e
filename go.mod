module github.com/dsec-dev/dsec

go 1.26.8

require (
	github.com/google/go-cmp v0.7.0
	github.com/tetratelabs/wazero v1.12.0
	golang.org/x/sys v0.44.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
)
