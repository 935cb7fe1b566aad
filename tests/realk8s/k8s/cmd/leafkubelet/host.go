// The host side of leafkubelet: its Node and Lease in the leaf apiserver, and the pods bound to
// it, whose containers run as local processes and whose status is written as a kubelet writes
// it.

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/version"
)

// host is one leaf node: the pods bound to it and their running containers.
type host struct {
	client  kubernetes.Interface
	node    string
	dataDir string
	// declared is the Node's status.declaredFeatures (--declare-websockets).
	declared []string

	mu   sync.Mutex
	pods map[string]*podRun // by namespace/name
}

// podRun is a pod this kubelet runs.
type podRun struct {
	pod        *v1.Pod
	ports      map[int32]int // container port -> local port
	containers map[string]*containerRun
	started    metav1.Time
	stopping   bool
}

// containerRun is one container's main process, restarted while the pod lives.
type containerRun struct {
	spec     v1.Container
	dir      string
	mu       sync.Mutex
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	restarts int32
	started  metav1.Time
	last     *v1.ContainerStateTerminated
	attached []io.Writer // stdout of attached clients
	// ephemeral containers run once; ended holds how it ended.
	ephemeral bool
	ended     *v1.ContainerStateTerminated
	// exited is closed when the current process has exited and its output is written.
	exited chan struct{}
}

func newHost(client kubernetes.Interface, node, dataDir string) *host {
	return &host{client: client, node: node, dataDir: dataDir, pods: map[string]*podRun{}}
}

// registerNode creates (or takes over) the Node with the kubelet's address and port.
func (h *host) registerNode(ctx context.Context, port int32) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: h.node,
			Labels: map[string]string{
				"kubernetes.io/hostname": h.node,
				"kubernetes.io/os":       runtime.GOOS,
				"kubernetes.io/arch":     runtime.GOARCH,
			},
		},
	}
	created, err := h.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = h.client.CoreV1().Nodes().Get(ctx, h.node, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	created.Status = h.nodeStatus(port)
	_, err = h.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func (h *host) nodeStatus(port int32) v1.NodeStatus {
	now := metav1.Now()
	quantities := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("4"),
		v1.ResourceMemory:           resource.MustParse("8Gi"),
		v1.ResourcePods:             resource.MustParse("110"),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	condition := func(t v1.NodeConditionType, s v1.ConditionStatus, reason string) v1.NodeCondition {
		return v1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return v1.NodeStatus{
		Capacity:    quantities,
		Allocatable: quantities,
		Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: v1.NodeHostName, Address: h.node},
		},
		DaemonEndpoints:  v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: port}},
		DeclaredFeatures: h.declared,
		Conditions: []v1.NodeCondition{
			condition(v1.NodeReady, v1.ConditionTrue, "KubeletReady"),
			condition(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory"),
			condition(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure"),
			condition(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID"),
		},
		NodeInfo: v1.NodeSystemInfo{
			KubeletVersion:          version.Get().GitVersion,
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
			ContainerRuntimeVersion: "leafkubelet://1",
			OSImage:                 "leafkubelet",
			KernelVersion:           "local",
		},
	}
}

// heartbeat renews the node Lease every 10 s and the Ready condition every 40 s, like a kubelet.
func (h *host) heartbeat(ctx context.Context) {
	leases := h.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	duration := int32(40)
	for i := 0; ; i++ {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, h.node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: h.node, Namespace: v1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity: &h.node, LeaseDurationSeconds: &duration, RenewTime: &now,
				},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.RenewTime = &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil {
			log.Printf("leafkubelet: node lease: %v", err)
		}
		if i%4 == 3 {
			if node, err := h.client.CoreV1().Nodes().Get(ctx, h.node, metav1.GetOptions{}); err == nil {
				node.Status = h.nodeStatus(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
				if _, err := h.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
					log.Printf("leafkubelet: node status: %v", err)
				}
			}
		}
		time.Sleep(10 * time.Second)
	}
}

// runPods follows the pods bound to this node: starts new ones, stops deleted ones.
func (h *host) runPods(ctx context.Context) {
	selector := fields.OneTermEqualSelector("spec.nodeName", h.node).String()
	lw := cache.NewListWatchFromClient(h.client.CoreV1().RESTClient(), "pods", v1.NamespaceAll,
		fields.ParseSelectorOrDie(selector))
	_, controller := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { h.sync(ctx, obj.(*v1.Pod)) },
			UpdateFunc: func(_, obj any) { h.sync(ctx, obj.(*v1.Pod)) },
			DeleteFunc: func(obj any) {
				if pod, ok := obj.(*v1.Pod); ok {
					h.stop(podKey(pod))
				}
			},
		},
	})
	controller.Run(ctx.Done())
}

// sync starts a new pod, or ends one being deleted (and removes its object, as the kubelet does
// once its containers are gone).
func (h *host) sync(ctx context.Context, pod *v1.Pod) {
	key := podKey(pod)
	if pod.DeletionTimestamp != nil {
		h.stop(key)
		zero := int64(0)
		err := h.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			log.Printf("leafkubelet: deleting pod %s: %v", key, err)
		}
		return
	}
	h.mu.Lock()
	if run, ok := h.pods[key]; ok && run.pod.UID == pod.UID {
		// A running pod: the only change a kubelet acts on here is a new ephemeral container
		// (kubectl debug, through pods/ephemeralcontainers).
		var added []*containerRun
		for _, ec := range pod.Spec.EphemeralContainers {
			if _, ok := run.containers[ec.Name]; ok {
				continue
			}
			spec := v1.Container(ec.EphemeralContainerCommon)
			if len(spec.Command)+len(spec.Args) == 0 {
				spec.Command = []string{"sh"} // busybox's default
			}
			dir := filepath.Join(h.dataDir, pod.Namespace, pod.Name, spec.Name)
			c := &containerRun{spec: spec, dir: dir, ephemeral: true}
			run.containers[spec.Name] = c
			added = append(added, c)
		}
		if len(added) > 0 {
			run.pod = pod.DeepCopy()
		}
		h.mu.Unlock()
		for _, c := range added {
			go h.runEphemeral(ctx, run, c)
		}
		return
	}
	run := &podRun{pod: pod.DeepCopy(), ports: map[int32]int{}, containers: map[string]*containerRun{}, started: metav1.Now()}
	h.pods[key] = run
	h.mu.Unlock()

	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			local, err := freePort()
			if err != nil {
				log.Printf("leafkubelet: pod %s: %v", key, err)
				continue
			}
			run.ports[p.ContainerPort] = local
		}
	}
	for i := range pod.Spec.Containers {
		spec := pod.Spec.Containers[i]
		dir := filepath.Join(h.dataDir, pod.Namespace, pod.Name, spec.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Printf("leafkubelet: pod %s: %v", key, err)
			continue
		}
		c := &containerRun{spec: spec, dir: dir}
		run.containers[spec.Name] = c
		go h.keepRunning(ctx, run, c)
	}
}

// runEphemeral runs an ephemeral container once (they are never restarted) and reports how it
// ended.
func (h *host) runEphemeral(ctx context.Context, run *podRun, c *containerRun) {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		log.Printf("leafkubelet: %s/%s: %v", podKey(run.pod), c.spec.Name, err)
		return
	}
	exitCode, err := h.runOnce(ctx, run, c)
	if err != nil {
		log.Printf("leafkubelet: %s/%s: %v", podKey(run.pod), c.spec.Name, err)
	}
	c.mu.Lock()
	c.ended = c.terminated(run, exitCode)
	c.mu.Unlock()
	h.writeStatus(ctx, run)
}

// terminated is how the current process ended, as a kubelet reports it (c.mu held).
func (c *containerRun) terminated(run *podRun, exitCode int) *v1.ContainerStateTerminated {
	reason := "Completed"
	if exitCode != 0 {
		reason = "Error"
	}
	return &v1.ContainerStateTerminated{
		ExitCode: int32(exitCode), StartedAt: c.started, FinishedAt: metav1.Now(),
		Reason: reason, ContainerID: c.containerID(run),
	}
}

// stop kills a pod's processes and forgets it.
func (h *host) stop(key string) {
	h.mu.Lock()
	run, ok := h.pods[key]
	delete(h.pods, key)
	h.mu.Unlock()
	if !ok {
		return
	}
	h.mu.Lock()
	run.stopping = true
	h.mu.Unlock()
	for _, c := range run.containers {
		c.mu.Lock()
		if c.cmd != nil && c.cmd.Process != nil {
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		}
		c.mu.Unlock()
	}
}

// keepRunning runs a container's main process and restarts it when it ends (restartPolicy
// Always), keeping the previous instance's log for --previous.
func (h *host) keepRunning(ctx context.Context, run *podRun, c *containerRun) {
	for {
		h.mu.Lock()
		stopping := run.stopping
		h.mu.Unlock()
		if stopping {
			return
		}
		exitCode, err := h.runOnce(ctx, run, c)
		if err != nil {
			log.Printf("leafkubelet: %s/%s: %v", podKey(run.pod), c.spec.Name, err)
		}
		h.mu.Lock()
		stopping = run.stopping
		h.mu.Unlock()
		if stopping {
			return
		}
		c.mu.Lock()
		c.last = c.terminated(run, exitCode)
		c.restarts++
		c.mu.Unlock()
		_ = os.Rename(c.logPath(), c.previousLogPath())
		time.Sleep(time.Second)
	}
}

// Restart ends the current instance, as a container crash would (tests use it for --previous).
func (c *containerRun) restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil && c.cmd.Process != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (c *containerRun) logPath() string         { return filepath.Join(c.dir, "current.log") }
func (c *containerRun) previousLogPath() string { return filepath.Join(c.dir, "previous.log") }
func (c *containerRun) containerID(run *podRun) string {
	return fmt.Sprintf("leafkubelet://%s-%s", run.pod.UID, c.spec.Name)
}

// runOnce starts the main process, reports the pod Running, copies its output to the CRI log
// and to attached clients, and waits for it.
func (h *host) runOnce(ctx context.Context, run *podRun, c *containerRun) (int, error) {
	args := argv(&c.spec)
	if len(args) == 0 {
		args = []string{"sleep", "infinity"}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = containerEnv(&c.spec, run.ports)
	cmd.Dir = c.dir
	// Its own group (the container); killed with leafkubelet, which tests stop with SIGKILL, so
	// no container outlives the test that ran it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return -1, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return -1, err
	}
	var stdin io.WriteCloser
	if c.spec.Stdin {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return -1, err
		}
	}
	logFile, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return -1, err
	}
	defer logFile.Close()
	if err := cmd.Start(); err != nil {
		return -1, err
	}
	exited := make(chan struct{})
	defer close(exited)
	c.mu.Lock()
	c.cmd, c.stdin, c.started, c.exited = cmd, stdin, metav1.Now(), exited
	c.mu.Unlock()
	h.writeStatus(ctx, run)

	var logMu sync.Mutex
	var wg sync.WaitGroup
	for _, stream := range []struct {
		name string
		r    io.Reader
	}{{"stdout", stdout}, {"stderr", stderr}} {
		wg.Add(1)
		go func(name string, r io.Reader) {
			defer wg.Done()
			reader := bufio.NewReader(r)
			for {
				line, err := reader.ReadString('\n')
				if len(line) > 0 {
					tag := "F"
					text := line
					if line[len(line)-1] == '\n' {
						text = line[:len(line)-1]
					} else {
						tag = "P"
					}
					logMu.Lock()
					fmt.Fprintf(logFile, "%s %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), name, tag, text)
					logMu.Unlock()
					c.mu.Lock()
					for _, w := range c.attached {
						_, _ = io.WriteString(w, line)
					}
					c.mu.Unlock()
				}
				if err != nil {
					return
				}
			}
		}(stream.name, stream.r)
	}
	wg.Wait()
	err = cmd.Wait()
	if exit, ok := err.(*exec.ExitError); ok {
		return exit.ExitCode(), nil
	}
	return 0, err
}

// writeStatus reports the pod Running with its containers' states.
func (h *host) writeStatus(ctx context.Context, run *podRun) {
	for attempt := 0; attempt < 5; attempt++ {
		pod, err := h.client.CoreV1().Pods(run.pod.Namespace).Get(ctx, run.pod.Name, metav1.GetOptions{})
		if err != nil {
			return
		}
		if pod.UID != run.pod.UID {
			return
		}
		now := metav1.Now()
		ready := func(t v1.PodConditionType) v1.PodCondition {
			return v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now}
		}
		pod.Status.Phase = v1.PodRunning
		pod.Status.HostIP = "127.0.0.1"
		pod.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
		pod.Status.PodIP = "127.0.0.1"
		pod.Status.PodIPs = []v1.PodIP{{IP: "127.0.0.1"}}
		pod.Status.StartTime = &run.started
		pod.Status.Conditions = []v1.PodCondition{
			ready(v1.PodInitialized), ready(v1.PodReady), ready(v1.ContainersReady), ready(v1.PodScheduled),
		}
		pod.Status.ContainerStatuses = nil
		pod.Status.EphemeralContainerStatuses = nil
		// sync adds ephemeral containers under h.mu: read a snapshot.
		h.mu.Lock()
		ephemeral := run.pod.Spec.EphemeralContainers
		containers := make(map[string]*containerRun, len(run.containers))
		for name, c := range run.containers {
			containers[name] = c
		}
		h.mu.Unlock()
		for _, ec := range ephemeral {
			c, ok := containers[ec.Name]
			if !ok {
				continue
			}
			c.mu.Lock()
			status := v1.ContainerStatus{
				Name: ec.Name, Image: ec.Image, ImageID: "leafkubelet://" + ec.Image,
				ContainerID: c.containerID(run),
				State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: c.started}},
			}
			if c.ended != nil {
				status.State = v1.ContainerState{Terminated: c.ended}
			}
			c.mu.Unlock()
			pod.Status.EphemeralContainerStatuses = append(pod.Status.EphemeralContainerStatuses, status)
		}
		for _, spec := range run.pod.Spec.Containers {
			c, ok := containers[spec.Name]
			if !ok {
				continue
			}
			c.mu.Lock()
			status := v1.ContainerStatus{
				Name: spec.Name, Ready: true, Started: boolPtr(true), RestartCount: c.restarts,
				Image: spec.Image, ImageID: "leafkubelet://" + spec.Image, ContainerID: c.containerID(run),
				State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: c.started}},
			}
			if c.last != nil {
				status.LastTerminationState = v1.ContainerState{Terminated: c.last}
			}
			c.mu.Unlock()
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, status)
		}
		_, err = h.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) {
			if err != nil {
				log.Printf("leafkubelet: status of %s: %v", podKey(pod), err)
			}
			return
		}
	}
}

func boolPtr(b bool) *bool { return &b }

// lookup finds a running pod's container by namespace/name; uid must match when given.
func (h *host) lookup(key string, uid podUID, container string) (*podRun, *containerRun, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	run, ok := h.pods[key]
	if !ok || (uid != "" && run.pod.UID != types.UID(uid)) {
		return nil, nil, fmt.Errorf("pod %q does not exist", key)
	}
	if container == "" {
		return run, nil, nil
	}
	c, ok := run.containers[container]
	if !ok {
		return nil, nil, fmt.Errorf("container %q not found in pod %q", container, key)
	}
	return run, c, nil
}
