// nri-noop: an NRI plugin that subscribes to the same container events as kunpeng-tap
// (create, post-start, update, post-update, stop, remove) and changes nothing. The start-path
// benchmark (e2e/src/bin/start_path.rs, row (e)) runs it to measure what the NRI hop itself
// costs a plugin written with containerd's own stub library: the floor under any NRI plugin's
// CPU per container start on a given machine.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type noop struct{}

func (noop) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

func (noop) PostStartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func (noop) UpdateContainer(context.Context, *api.PodSandbox, *api.Container, *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

func (noop) PostUpdateContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func (noop) StopContainer(context.Context, *api.PodSandbox, *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

func (noop) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func main() {
	socket := flag.String("nri-socket", "/var/run/nri/nri.sock", "containerd's NRI socket")
	flag.Parse()
	s, err := stub.New(noop{}, stub.WithPluginName("noop"), stub.WithPluginIdx("10"),
		stub.WithSocketPath(*socket))
	if err != nil {
		log.Fatalf("nri-noop: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Fatalf("nri-noop: %v", err)
	}
}
