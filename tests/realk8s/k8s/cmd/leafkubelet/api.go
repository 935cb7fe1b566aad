// The kubelet API of leafkubelet: the routes the leaf apiserver calls (exec, attach,
// portForward, containerLogs, healthz) and the one metrics-server scrapes (metrics/resource,
// metrics.go), served with the kubelet's streaming code for the upgrades, and the local
// processes behind them.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	utilexec "k8s.io/utils/exec"
)

// The kubelet's defaults.
const (
	idleTimeout           = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

func (h *host) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/exec/", h.serveExec)
	mux.HandleFunc("/attach/", h.serveAttach)
	mux.HandleFunc("/portForward/", h.servePortForward)
	mux.HandleFunc("/containerLogs/", h.serveLogs)
	mux.HandleFunc("/metrics/resource", h.serveResourceMetrics)
	return mux
}

// target reads {ns}/{pod}[/{uid}]/{container} (or {ns}/{pod}[/{uid}] without a container).
func target(path string, withContainer bool) (key string, uid podUID, container string, ok bool) {
	parts := splitPath(path)[1:]
	switch {
	case withContainer && len(parts) == 3:
		return parts[0] + "/" + parts[1], "", parts[2], true
	case withContainer && len(parts) == 4:
		return parts[0] + "/" + parts[1], podUID(parts[2]), parts[3], true
	case !withContainer && len(parts) == 2:
		return parts[0] + "/" + parts[1], "", "", true
	case !withContainer && len(parts) == 3:
		return parts[0] + "/" + parts[1], podUID(parts[2]), "", true
	}
	return "", "", "", false
}

func (h *host) serveExec(w http.ResponseWriter, req *http.Request) {
	key, uid, container, ok := target(req.URL.Path, true)
	if !ok {
		http.NotFound(w, req)
		return
	}
	if _, _, err := h.lookup(key, uid, container); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	opts, err := newStreamOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	serveExec(w, req, h, key, uid, container, req.URL.Query()["command"], opts,
		idleTimeout, streamCreationTimeout, remoteCommandProtocols)
}

func (h *host) serveAttach(w http.ResponseWriter, req *http.Request) {
	key, uid, container, ok := target(req.URL.Path, true)
	if !ok {
		http.NotFound(w, req)
		return
	}
	if _, _, err := h.lookup(key, uid, container); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	opts, err := newStreamOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	serveAttach(w, req, h, key, uid, container, opts,
		idleTimeout, streamCreationTimeout, remoteCommandProtocols)
}

func (h *host) servePortForward(w http.ResponseWriter, req *http.Request) {
	key, uid, _, ok := target(req.URL.Path, false)
	if !ok {
		http.NotFound(w, req)
		return
	}
	if _, _, err := h.lookup(key, uid, ""); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	opts, err := newPortForwardOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	servePortForward(w, req, h, key, uid, opts, idleTimeout, streamCreationTimeout,
		portForwardProtocols)
}

// ExecInContainer runs cmd as a local process with the container's environment; a non-zero
// exit is an ExitError, which the streaming code reports as the exit code.
func (h *host) ExecInContainer(ctx context.Context, key string, uid podUID, container string, cmd []string,
	in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan terminalSize, _ time.Duration) error {
	run, c, err := h.lookup(key, uid, container)
	if err != nil {
		return err
	}
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	proc := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	proc.Env = containerEnv(&c.spec, run.ports)
	proc.Dir = c.dir
	if tty {
		return runWithTTY(proc, in, out, resize)
	}
	proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	proc.Stdout, proc.Stderr = out, errOut
	if in != nil {
		stdin, err := proc.StdinPipe()
		if err != nil {
			return err
		}
		go func() {
			_, _ = io.Copy(stdin, in)
			_ = stdin.Close()
		}()
	}
	return exitError(proc.Run())
}

func runWithTTY(proc *exec.Cmd, in io.Reader, out io.Writer, resize <-chan terminalSize) error {
	// The client sends its terminal's size right after the streams are made; start the
	// process with it, as runtimes start a container's process with the console size, so the
	// first thing the process reads is the client's size.
	var initial *pty.Winsize
	select {
	case size, ok := <-resize:
		if ok {
			initial = &pty.Winsize{Rows: size.Height, Cols: size.Width}
		}
	case <-time.After(2 * time.Second):
	}
	terminal, err := pty.StartWithSize(proc, initial)
	if err != nil {
		return err
	}
	defer terminal.Close()
	go func() {
		for size := range resize {
			_ = pty.Setsize(terminal, &pty.Winsize{Rows: size.Height, Cols: size.Width})
		}
	}()
	if in != nil {
		go func() { _, _ = io.Copy(terminal, in) }()
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, terminal)
		close(done)
	}()
	err = proc.Wait()
	<-done
	return exitError(err)
}

// exitError turns a process's non-zero exit into the kubelet's exit error.
func exitError(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return utilexec.CodeExitError{Err: err, Code: exit.ExitCode()}
	}
	return err
}

// AttachContainer joins the container's main process: its output from now on, and its stdin.
func (h *host) AttachContainer(ctx context.Context, key string, uid podUID, container string,
	in io.Reader, out, errOut io.WriteCloser, _ bool, _ <-chan terminalSize) error {
	_, c, err := h.lookup(key, uid, container)
	if err != nil {
		return err
	}
	var sink io.Writer = io.Discard
	if out != nil {
		sink = out
	}
	c.mu.Lock()
	c.attached = append(c.attached, sink)
	stdin, exited := c.stdin, c.exited
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		for i, w := range c.attached {
			if w == sink {
				c.attached = append(c.attached[:i], c.attached[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
	}()
	// Like containerd's attach to a container without stdinOnce: the session ends when the
	// process exits or when the client closes its stdin (the process then runs on).
	stdinDone := make(chan struct{})
	if in != nil && stdin != nil {
		go func() {
			_, _ = io.Copy(stdin, in)
			close(stdinDone)
		}()
	}
	select {
	case <-ctx.Done():
	case <-exited:
	case <-stdinDone:
	}
	return nil
}

// PortForward connects a forwarded stream to the local port of the pod's container port.
func (h *host) PortForward(_ context.Context, key string, uid podUID, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	run, _, err := h.lookup(key, uid, "")
	if err != nil {
		return err
	}
	local, ok := run.ports[port]
	if !ok {
		return fmt.Errorf("pod %s has no container port %d", key, port)
	}
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", local))
	if err != nil {
		return fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s: %w", port, key, err)
	}
	defer conn.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(conn, stream)
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
	}()
	_, _ = io.Copy(stream, conn)
	wg.Wait()
	return nil
}

// logLine is one line of a CRI log file.
type logLine struct {
	at     time.Time
	stream string
	text   string
	full   bool
}

func parseLogLine(line string) (logLine, bool) {
	parts := strings.SplitN(line, " ", 4)
	if len(parts) < 4 {
		return logLine{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, parts[0])
	if err != nil {
		return logLine{}, false
	}
	return logLine{at: at, stream: parts[1], text: parts[3], full: parts[2] == "F"}, true
}

// serveLogs answers containerLogs from the container's CRI log file, with the kubelet's options.
func (h *host) serveLogs(w http.ResponseWriter, req *http.Request) {
	key, _, container, ok := target(req.URL.Path, true)
	if !ok {
		http.NotFound(w, req)
		return
	}
	run, c, err := h.lookup(key, "", container)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	q := req.URL.Query()
	path := c.logPath()
	if q.Get("previous") == "true" {
		path = c.previousLogPath()
		if _, err := os.Stat(path); err != nil {
			http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", container, run.pod.Name),
				http.StatusBadRequest)
			return
		}
	}
	var since time.Time
	if s := q.Get("sinceSeconds"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			http.Error(w, "sinceSeconds must be a positive integer", http.StatusBadRequest)
			return
		}
		since = time.Now().Add(-time.Duration(n) * time.Second)
	}
	if s := q.Get("sinceTime"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			http.Error(w, "sinceTime: "+err.Error(), http.StatusBadRequest)
			return
		}
		since = t
	}
	tail := -1
	if s := q.Get("tailLines"); s != "" {
		if tail, err = strconv.Atoi(s); err != nil || tail < 0 {
			http.Error(w, "tailLines must be a non-negative integer", http.StatusBadRequest)
			return
		}
	}
	limit := int64(-1)
	if s := q.Get("limitBytes"); s != "" {
		if limit, err = strconv.ParseInt(s, 10, 64); err != nil || limit < 1 {
			http.Error(w, "limitBytes must be a positive integer", http.StatusBadRequest)
			return
		}
	}
	timestamps := q.Get("timestamps") == "true"
	follow := q.Get("follow") == "true" && q.Get("previous") != "true"

	file, err := os.Open(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	defer file.Close()
	w.Header().Set("Content-Type", "text/plain")
	flusher, _ := w.(http.Flusher)
	written := int64(0)
	emit := func(l logLine) bool {
		if !since.IsZero() && l.at.Before(since) {
			return true
		}
		text := l.text
		if l.full {
			text += "\n"
		}
		if timestamps {
			text = l.at.Format(time.RFC3339Nano) + " " + text
		}
		if limit >= 0 && written+int64(len(text)) > limit {
			text = text[:limit-written]
		}
		n, err := io.WriteString(w, text)
		written += int64(n)
		return err == nil && (limit < 0 || written < limit)
	}
	reader := bufio.NewReader(file)
	var lines []logLine
	for {
		raw, err := reader.ReadString('\n')
		if l, ok := parseLogLine(strings.TrimSuffix(raw, "\n")); ok && strings.HasSuffix(raw, "\n") {
			lines = append(lines, l)
		}
		if err != nil {
			break
		}
	}
	if tail >= 0 && len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	for _, l := range lines {
		if !emit(l) {
			return
		}
	}
	if flusher != nil {
		flusher.Flush()
	}
	if !follow {
		return
	}
	var partial string
	for {
		select {
		case <-req.Context().Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		for {
			raw, err := reader.ReadString('\n')
			partial += raw
			if err != nil {
				break
			}
			if l, ok := parseLogLine(strings.TrimSuffix(partial, "\n")); ok && !emit(l) {
				return
			}
			partial = ""
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}
