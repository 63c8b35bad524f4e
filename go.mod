module github.com/dsec-dev/dsec

go 1.26.8

require (
	github.com/coder/websocket v1.8.15
	github.com/google/go-cmp v0.7.0
	github.com/spf13/cobra v1.10.2
	github.com/tetratelabs/wazero v1.12.0
	golang.org/x/sys v0.44.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
)
