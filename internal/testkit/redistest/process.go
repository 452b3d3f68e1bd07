// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds the wait for a started server to answer.
	readyTimeout = 10 * time.Second
	// stopTimeout is how long a server gets to exit after SIGTERM.
	stopTimeout = 5 * time.Second
	// launchAttempts is how often a start is tried, in case a port was taken.
	launchAttempts = 3
	// busOffset is the distance between a cluster node's port and its bus port.
	busOffset = 10000
	// maxClusterPort keeps cluster bus ports below 65536.
	maxClusterPort = 55000
	// logTailLines is how much of a server's log goes into failure messages.
	logTailLines = 20
)

// instance is one redis-server, run as a local process or in a container.
type instance interface {
	// start launches the server (again, after stop) and returns once it
	// was launched; it does not wait for it to answer.
	start(ctx context.Context) error
	// exited is closed when the launched server exits; nil if unknown.
	exited() <-chan struct{}
	// stop terminates the server gracefully, then forcibly; it is a no-op
	// when the server is not running.
	stop(ctx context.Context) error
	// kill terminates the server at once (SIGKILL), as a crash would; it
	// is a no-op when the server is not running.
	kill(ctx context.Context) error
	pause(ctx context.Context) error
	resume(ctx context.Context) error
	// pid is the host process ID, or 0 when unknown.
	pid() int
	// pidfile is the server's configured pidfile, unique per instance; it
	// tells this server apart from another one that took the port.
	pidfile() string
	logTail(ctx context.Context) string
	// destroy stops the server and removes everything it left behind.
	destroy(ctx context.Context) error
}

// backend creates instances.
type backend interface {
	newInstance(port int, cluster bool) (instance, error)
}

// serverArgs returns the redis-server arguments shared by all backends;
// sec, when not nil, secures the server.
func serverArgs(port int, dir, logfile, pidfile, nodesFile string, sec *Security) []string {
	listen := []string{"--port", strconv.Itoa(port)}
	if sec != nil {
		listen = sec.serverArgs(port, nodesFile != "")
	}
	args := []string{
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", logfile,
		"--pidfile", pidfile,
	}
	args = append(args, listen...)
	if nodesFile != "" {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", nodesFile,
			"--cluster-node-timeout", "1000",
			// Replicas always try to take over, however long their
			// master was unreachable, so failover tests are predictable.
			"--cluster-replica-validity-factor", "0",
		)
		args = append(args, replicationArgs()...)
	}
	return args
}

// replicationArgs returns the redis-server arguments of servers that have
// replicas or are one: the nodes of a Cluster or a Sentinel setup.
func replicationArgs() []string {
	return []string{
		// Replicas sync at once rather than after the default 5 s.
		"--repl-diskless-sync", "yes",
		"--repl-diskless-sync-delay", "0",
		// A replica is listed in CLUSTER SLOTS only once its replication
		// offset is non-zero; the master's periodic PING (10 s by
		// default) is what moves it on an idle master.
		"--repl-ping-replica-period", "1",
		// Masters exit on SIGTERM without waiting for replicas to
		// acknowledge the last writes.
		"--shutdown-on-sigterm", "now",
	}
}

// processBackend runs redis-server binaries as child processes, secured
// as sec says when it is not nil.
type processBackend struct {
	bin string
	sec *Security
}

func (b processBackend) newInstance(port int, cluster bool) (instance, error) {
	l, err := b.newLocal(port)
	if err != nil {
		return nil, err
	}
	nodesFile := ""
	if cluster {
		nodesFile = filepath.Join(l.dir, "nodes.conf")
	}
	l.args = serverArgs(port, l.dir, l.log, l.pidPath, nodesFile, b.sec)
	return l, nil
}

// newLocal prepares a process in a new temporary directory, with its log
// and pidfile there; the caller sets its arguments.
func (b processBackend) newLocal(port int) (*localInstance, error) {
	dir, err := os.MkdirTemp("", "redistest-"+strconv.Itoa(port)+"-")
	if err != nil {
		return nil, fmt.Errorf("create server directory: %w", err)
	}
	l := &localInstance{
		bin:     b.bin,
		dir:     dir,
		log:     filepath.Join(dir, "redis.log"),
		pidPath: filepath.Join(dir, "redis.pid"),
		sec:     b.sec,
	}
	if b.sec != nil {
		l.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		secured.Store(l.addr, b.sec)
	}
	return l, nil
}

// localInstance is a redis-server child process.
type localInstance struct {
	bin, dir, log, pidPath string
	// sec secures the server, whose address is addr, when not nil.
	sec  *Security
	addr string
	// args are the arguments of the next start; they may change while the
	// server is stopped.
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returns
}

func (l *localInstance) start(context.Context) error {
	out, err := os.OpenFile(l.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(l.bin, l.args...)
	cmd.Dir = l.dir
	// Output written before the log file is opened (such as
	// configuration errors) lands in the same file.
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := onSpawnThread(cmd.Start); err != nil {
		return fmt.Errorf("start %s: %w", l.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	l.mu.Lock()
	l.cmd, l.done = cmd, done
	l.mu.Unlock()
	return nil
}

func (l *localInstance) current() (*exec.Cmd, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cmd, l.done
}

func (l *localInstance) exited() <-chan struct{} {
	_, done := l.current()
	return done
}

func (l *localInstance) stop(context.Context) error {
	cmd, done := l.current()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := signal(cmd, syscall.SIGTERM); err != nil {
		return err
	}
	// A paused server handles SIGTERM only once it runs again.
	if err := signal(cmd, syscall.SIGCONT); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(stopTimeout):
	}
	if err := signal(cmd, syscall.SIGKILL); err != nil {
		return err
	}
	<-done
	return nil
}

func (l *localInstance) kill(context.Context) error {
	cmd, done := l.current()
	if cmd == nil {
		return nil
	}
	if err := signal(cmd, syscall.SIGKILL); err != nil {
		return err
	}
	<-done
	return nil
}

func (l *localInstance) pause(context.Context) error {
	cmd, _ := l.current()
	return signal(cmd, syscall.SIGSTOP)
}

func (l *localInstance) resume(context.Context) error {
	cmd, _ := l.current()
	return signal(cmd, syscall.SIGCONT)
}

func (l *localInstance) pid() int {
	cmd, _ := l.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

func (l *localInstance) pidfile() string { return l.pidPath }

func (l *localInstance) logTail(context.Context) string {
	data, err := os.ReadFile(l.log)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", l.log, err)
	}
	return tail(data)
}

func (l *localInstance) destroy(ctx context.Context) error {
	err := l.stop(ctx)
	if l.sec != nil {
		secured.Delete(l.addr)
	}
	if rmErr := os.RemoveAll(l.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("remove server directory: %w", rmErr))
	}
	return err
}

// signal sends sig to cmd's process; a process that already exited is not
// an error.
func signal(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("send %v to redis-server (pid %d): %w", sig, cmd.Process.Pid, err)
	}
	return nil
}

// tail returns the last lines of a log.
func tail(data []byte) string {
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

var spawn struct {
	once sync.Once
	reqs chan func()
}

// StartChild starts cmd so that the kernel kills it (Pdeathsig, SIGKILL)
// when the test binary exits, however it exits; cmd's SysProcAttr may set
// other attributes. For the processes tests start besides redis-server,
// such as idemsvc itself.
func StartChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return onSpawnThread(cmd.Start)
}

// onSpawnThread runs f on one OS thread that lives as long as the test
// binary. Pdeathsig fires when the thread that started a child exits, not
// when the process does, so children must not be started from threads the
// Go runtime may end.
func onSpawnThread(f func() error) error {
	spawn.once.Do(func() {
		spawn.reqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must live on
			for req := range spawn.reqs {
				req()
			}
		}()
	})
	errc := make(chan error, 1)
	spawn.reqs <- func() { errc <- f() }
	return <-errc
}

// proc is one server owned by the harness, with the ports reserved for it.
type proc struct {
	addr  string
	ports []int
	inst  instance
	id    identity

	mu      sync.Mutex
	running bool
}

// identity tells the server a proc started apart from another one that
// took its port: query asks whoever answers on the port, and want is what
// our server answers.
type identity struct {
	what  string // what query asks for, for messages
	query func(ctx context.Context, rdb *redis.Client) (string, error)
	want  string
}

// pidfileIdentity identifies a server by its pidfile, unique per instance.
func pidfileIdentity(pidfile string) identity {
	return identity{what: "pidfile", want: pidfile, query: func(ctx context.Context, rdb *redis.Client) (string, error) {
		cfg, err := rdb.ConfigGet(ctx, "pidfile").Result()
		if err != nil {
			return "", fmt.Errorf("config get pidfile: %w", err)
		}
		return cfg["pidfile"], nil
	}}
}

// spawnProc starts a new server on fresh ports, retrying with other ports if
// the server does not come up.
func spawnProc(ctx context.Context, b backend, cluster bool) (*proc, error) {
	return spawnWith(ctx, cluster, func(port int) (instance, identity, error) {
		inst, err := b.newInstance(port, cluster)
		if err != nil {
			return nil, identity{}, err
		}
		return inst, pidfileIdentity(inst.pidfile()), nil
	})
}

// spawnWith starts the server that newInst prepares for a fresh port,
// retrying with other ports if the server does not come up.
func spawnWith(ctx context.Context, cluster bool, newInst func(port int) (instance, identity, error)) (*proc, error) {
	var errs []error
	for range launchAttempts {
		port, err := reservePort(cluster)
		if err != nil {
			return nil, err
		}
		ports := []int{port}
		if cluster {
			ports = append(ports, port+busOffset)
		}
		inst, id, err := newInst(port)
		if err != nil {
			releasePorts(ports)
			return nil, err
		}
		p := &proc{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), ports: ports, inst: inst, id: id}
		err = p.launch(ctx)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
		if dErr := p.destroy(ctx); dErr != nil {
			errs = append(errs, dErr)
		}
	}
	return nil, fmt.Errorf("start redis-server (%d attempts): %w", launchAttempts, errors.Join(errs...))
}

// launch starts the server and waits until it answers.
func (p *proc) launch(ctx context.Context) error {
	if err := p.inst.start(ctx); err != nil {
		return err
	}
	if err := waitReady(ctx, p.addr, p.id, p.inst.exited()); err != nil {
		logs := p.inst.logTail(ctx)
		stopErr := p.inst.stop(ctx)
		return errors.Join(fmt.Errorf("redis-server on %s: %w\nlast lines of its log:\n%s", p.addr, err, logs), stopErr)
	}
	p.mu.Lock()
	p.running = true
	p.mu.Unlock()
	return nil
}

// restart starts a stopped server again on its own port. The port can be
// taken briefly by another process, so the start is retried.
func (p *proc) restart(ctx context.Context) error {
	var err error
	for i := range launchAttempts {
		if i > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if err = p.launch(ctx); err == nil {
			return nil
		}
	}
	return err
}

func (p *proc) halt(ctx context.Context) error {
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()
	if err := p.inst.stop(ctx); err != nil {
		return fmt.Errorf("stop redis-server on %s: %w", p.addr, err)
	}
	return nil
}

// kill ends the server at once, as a crash would.
func (p *proc) kill(ctx context.Context) error {
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()
	if err := p.inst.kill(ctx); err != nil {
		return fmt.Errorf("kill redis-server on %s: %w", p.addr, err)
	}
	return nil
}

func (p *proc) isRunning() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

func (p *proc) destroy(ctx context.Context) error {
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()
	err := p.inst.destroy(ctx)
	releasePorts(p.ports)
	if err != nil {
		return fmt.Errorf("remove redis-server on %s: %w", p.addr, err)
	}
	return nil
}

// pause stops the server's process until the returned function is called
// or the test ends.
func (p *proc) pause(tb testing.TB) (resume func()) {
	tb.Helper()
	ctx := context.Background()
	if !p.isRunning() {
		tb.Fatalf("redistest: cannot pause redis-server on %s: it is not running", p.addr)
	}
	if err := p.inst.pause(ctx); err != nil {
		tb.Fatalf("redistest: pause redis-server on %s: %v", p.addr, err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if !p.isRunning() {
				return
			}
			if err := p.inst.resume(ctx); err != nil {
				tb.Errorf("redistest: resume redis-server on %s: %v", p.addr, err)
			}
		})
	}
	tb.Cleanup(resume)
	return resume
}

// waitReady polls the server at addr until it answers as the server id
// identifies, the server exits, or readyTimeout passes.
func waitReady(ctx context.Context, addr string, id identity, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	opts := &redis.Options{
		Addr:          addr,
		DialTimeout:   250 * time.Millisecond,
		ReadTimeout:   250 * time.Millisecond,
		WriteTimeout:  250 * time.Millisecond,
		MaxRetries:    -1,
		DialerRetries: 1,
		PoolSize:      1,
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		got, err := probe(ctx, secure(opts), id.query)
		switch {
		case err != nil:
			last = err
		case got == id.want:
			return nil
		default:
			return fmt.Errorf("another server answers on %s (%s %q)", addr, id.what, got)
		}
		select {
		case <-exited:
			return errors.New("redis-server exited during start")
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %w", readyTimeout, last)
		case <-tick.C:
		}
	}
}

// probe runs query against the server. It checks first that the port
// accepts connections, since the client logs every failed dial, and uses a
// fresh client each time, since a client's pool that failed to dial retries
// only once a second.
func probe(ctx context.Context, opts *redis.Options, query func(context.Context, *redis.Client) (string, error)) (string, error) {
	d := net.Dialer{Timeout: opts.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", opts.Addr)
	if err != nil {
		return "", err
	}
	_ = conn.Close()
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	return query(ctx, rdb)
}

var ports struct {
	mu   sync.Mutex
	used map[int]bool
}

// reservePort finds a free loopback port; for cluster nodes the bus port
// (port+10000) must be free too. Ports handed out stay reserved until
// released so concurrent tests in one binary never get the same port.
func reservePort(cluster bool) (int, error) {
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.used == nil {
		ports.used = make(map[int]bool)
	}
	var lastErr error
	for range 200 {
		port, err := freePort(cluster)
		if err != nil {
			lastErr = err
			continue
		}
		if ports.used[port] || (cluster && ports.used[port+busOffset]) {
			continue
		}
		ports.used[port] = true
		if cluster {
			ports.used[port+busOffset] = true
		}
		return port, nil
	}
	return 0, fmt.Errorf("find a free loopback port: %w", lastErr)
}

func releasePorts(ps []int) {
	ports.mu.Lock()
	defer ports.mu.Unlock()
	for _, p := range ps {
		delete(ports.used, p)
	}
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort(cluster bool) (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("listen on 127.0.0.1: %w", err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if !cluster {
		return port, nil
	}
	if port >= maxClusterPort {
		return 0, fmt.Errorf("port %d leaves no room for a bus port", port)
	}
	bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+busOffset)))
	if err != nil {
		return 0, fmt.Errorf("bus port of %d: %w", port, err)
	}
	bus.Close()
	return port, nil
}

// splitAddrs splits a comma-separated address list, dropping blanks.
func splitAddrs(s string) []string {
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}
