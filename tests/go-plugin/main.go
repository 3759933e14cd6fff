// nri-other: a small NRI plugin of nri-resize's tests, independent of nri-resize (NRI's own Go
// stub and transport), to run beside it on a real runtime.
//
//	-mode adjust: on every UpdateContainer, sets the container's cpuset (-cpus, -mems) and,
//	             when -unified is given, one cgroup v2 `unified` key: NRI records this plugin as
//	             the owner of those fields, as a topology or balloons policy would be.
//	-mode noop:   subscribes to the same events as nri-resize and answers every one empty:
//	             containerd's own floor for the cost of an NRI plugin.
//
// Every UpdateContainer it answers is logged on stdout as `update <container id> <what it set>`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	adjust  bool
	cpus    string
	mems    string
	unified map[string]string
}

func (p *plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	fmt.Printf("configured by %s %s\n", runtime, version)
	return api.MustParseEventMask(
		"RunPodSandbox", "StopPodSandbox", "RemovePodSandbox",
		"CreateContainer", "PostCreateContainer", "StartContainer", "PostStartContainer",
		"UpdateContainer", "PostUpdateContainer", "StopContainer", "RemoveContainer",
	), nil
}

func (p *plugin) Synchronize(_ context.Context, _ []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	fmt.Println("synchronized")
	return nil, nil
}

func (p *plugin) RunPodSandbox(context.Context, *api.PodSandbox) error    { return nil }
func (p *plugin) StopPodSandbox(context.Context, *api.PodSandbox) error   { return nil }
func (p *plugin) RemovePodSandbox(context.Context, *api.PodSandbox) error { return nil }

func (p *plugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

func (p *plugin) PostCreateContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (p *plugin) StartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (p *plugin) PostStartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (p *plugin) PostUpdateContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}
func (p *plugin) StopContainer(context.Context, *api.PodSandbox, *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}
func (p *plugin) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func (p *plugin) UpdateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	if !p.adjust {
		return nil, nil
	}
	u := &api.ContainerUpdate{}
	u.SetContainerId(ctr.GetId())
	set := []string{}
	if p.cpus != "" {
		u.SetLinuxCPUSetCPUs(p.cpus)
		set = append(set, "cpus="+p.cpus)
	}
	if p.mems != "" {
		u.SetLinuxCPUSetMems(p.mems)
		set = append(set, "mems="+p.mems)
	}
	for k, v := range p.unified {
		u.AddLinuxUnified(k, v)
		set = append(set, k+"="+v)
	}
	fmt.Printf("update %s %s\n", ctr.GetId(), strings.Join(set, " "))
	return []*api.ContainerUpdate{u}, nil
}

func main() {
	var (
		socket  = flag.String("socket", "", "the runtime's NRI socket")
		name    = flag.String("name", "nri-other", "plugin name")
		idx     = flag.String("idx", "90", "plugin index (order among plugins)")
		mode    = flag.String("mode", "adjust", "adjust | noop")
		cpus    = flag.String("cpus", "", "cpuset.cpus to set on every UpdateContainer")
		mems    = flag.String("mems", "", "cpuset.mems to set on every UpdateContainer")
		unified = flag.String("unified", "", "key=value: a cgroup v2 unified key to set on every UpdateContainer")
	)
	flag.Parse()
	p := &plugin{adjust: *mode == "adjust", cpus: *cpus, mems: *mems, unified: map[string]string{}}
	if *mode != "adjust" && *mode != "noop" {
		fmt.Fprintf(os.Stderr, "unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	if *unified != "" {
		kv := strings.SplitN(*unified, "=", 2)
		if len(kv) != 2 {
			fmt.Fprintf(os.Stderr, "-unified wants key=value, got %q\n", *unified)
			os.Exit(2)
		}
		p.unified[kv[0]] = kv[1]
	}
	opts := []stub.Option{stub.WithPluginName(*name), stub.WithPluginIdx(*idx)}
	if *socket != "" {
		opts = append(opts, stub.WithSocketPath(*socket))
	}
	s, err := stub.New(p, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stub: %v\n", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "plugin exited: %v\n", err)
		os.Exit(1)
	}
}
