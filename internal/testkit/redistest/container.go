// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

const (
	// redisImage is the image of containerised servers.
	redisImage = "redis:7.0"
	// dockerProbeTimeout bounds the check for a Docker engine.
	dockerProbeTimeout = 2 * time.Second
	// containerStartTimeout bounds starting a container, image pull included.
	containerStartTimeout = 5 * time.Minute
)

// probeDocker reports whether a Docker engine answers.
func probeDocker() error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerProbeTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("docker ping: %w", err)
	}
	return nil
}

// containerBackend runs redis-server in containers on the host network,
// so the ports chosen on the host are the servers' own.
type containerBackend struct{}

func (containerBackend) newInstance(port int, cluster bool) (instance, error) {
	const dir = "/data" // the image's working directory, writable by redis
	nodesFile := ""
	if cluster {
		nodesFile = dir + "/nodes.conf"
	}
	// The pidfile name tells this server apart from others on the host.
	pidfile := dir + "/redis-" + rand.Text() + ".pid"
	args := append([]string{"redis-server"}, serverArgs(port, dir, "", pidfile, nodesFile, nil)...)
	return &containerInstance{args: args, pidPath: pidfile}, nil
}

// containerInstance is a redis-server in a container.
type containerInstance struct {
	args    []string
	pidPath string
	ctr     *testcontainers.DockerContainer
}

func (c *containerInstance) start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, containerStartTimeout)
	defer cancel()
	if c.ctr != nil {
		if err := c.ctr.Start(ctx); err != nil {
			return fmt.Errorf("start container: %w", err)
		}
		return nil
	}
	ctr, err := testcontainers.Run(ctx, redisImage,
		testcontainers.WithCmd(c.args...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
		}),
	)
	c.ctr = ctr // may be set on error too, for destroy to remove it
	if err != nil {
		return fmt.Errorf("run %s container: %w", redisImage, err)
	}
	return nil
}

func (c *containerInstance) exited() <-chan struct{} { return nil }

func (c *containerInstance) stop(ctx context.Context) error {
	if c.ctr == nil {
		return nil
	}
	timeout := stopTimeout
	if err := c.ctr.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stop container: %w", err)
	}
	return nil
}

func (c *containerInstance) kill(ctx context.Context) error {
	if c.ctr == nil {
		return nil
	}
	return c.withClient(ctx, func(cli *testcontainers.DockerClient) error {
		_, err := cli.ContainerKill(ctx, c.ctr.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"})
		return err
	})
}

func (c *containerInstance) pause(ctx context.Context) error {
	return c.withClient(ctx, func(cli *testcontainers.DockerClient) error {
		_, err := cli.ContainerPause(ctx, c.ctr.GetContainerID(), client.ContainerPauseOptions{})
		return err
	})
}

func (c *containerInstance) resume(ctx context.Context) error {
	return c.withClient(ctx, func(cli *testcontainers.DockerClient) error {
		_, err := cli.ContainerUnpause(ctx, c.ctr.GetContainerID(), client.ContainerUnpauseOptions{})
		return err
	})
}

func (c *containerInstance) withClient(ctx context.Context, f func(*testcontainers.DockerClient) error) error {
	if c.ctr == nil {
		return errors.New("container not started")
	}
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	defer cli.Close()
	if err := f(cli); err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	return nil
}

func (c *containerInstance) pid() int { return 0 }

func (c *containerInstance) pidfile() string { return c.pidPath }

func (c *containerInstance) logTail(ctx context.Context) string {
	if c.ctr == nil {
		return "(no container)"
	}
	rc, err := c.ctr.Logs(ctx)
	if err != nil {
		return fmt.Sprintf("(cannot read container logs: %v)", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Sprintf("(cannot read container logs: %v)", err)
	}
	return tail(data)
}

func (c *containerInstance) destroy(ctx context.Context) error {
	if c.ctr == nil {
		return nil
	}
	if err := c.ctr.Terminate(ctx); err != nil {
		return fmt.Errorf("remove container: %w", err)
	}
	return nil
}
