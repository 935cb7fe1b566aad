// The kubelet's /metrics/resource for leafkubelet's containers: what metrics-server scrapes.
// A container is its main process's process group (containers start with Setpgid); its CPU is
// the sum of every thread's schedstat (nanoseconds on a CPU, as precise as a cgroup's cpuacct;
// stat's 10 ms ticks would show an idle container as 0, which metrics-server drops), its
// memory the resident set. The node's figures are the sum of its containers.

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

type usage struct {
	cpuSeconds  float64
	memoryBytes uint64
}

// groupUsage reads every process in /proc once and sums the usage of those in each group.
func groupUsage(groups map[int]bool) map[int]usage {
	out := map[int]usage{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	page := uint64(os.Getpagesize())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue // gone between listing and reading
		}
		// Fields after the command name (which may hold spaces and parentheses): proc(5).
		rest := string(stat)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) < 22 {
			continue
		}
		pgrp, err1 := strconv.Atoi(fields[2])
		rss, err2 := strconv.ParseUint(fields[21], 10, 64)
		if err1 != nil || err2 != nil || !groups[pgrp] {
			continue
		}
		u := out[pgrp]
		u.cpuSeconds += threadsCPUSeconds(dir)
		u.memoryBytes += rss * page
		out[pgrp] = u
	}
	return out
}

func threadsCPUSeconds(procDir string) float64 {
	tasks, err := os.ReadDir(filepath.Join(procDir, "task"))
	if err != nil {
		return 0
	}
	var ns uint64
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(procDir, "task", t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				ns += v
			}
		}
	}
	return float64(ns) / 1e9
}

// closed tells whether ch is closed (a nil channel is not).
func closed(ch chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

type metricsRow struct {
	namespace, pod, container string
	started                   time.Time
	group                     int
}

func (h *host) serveResourceMetrics(w http.ResponseWriter, _ *http.Request) {
	var rows []metricsRow
	groups := map[int]bool{}
	h.mu.Lock()
	for _, run := range h.pods {
		for name, c := range run.containers {
			c.mu.Lock()
			// Only running containers, as a kubelet reports them (an exited ephemeral
			// container would read as 0, and metrics-server drops a pod with a 0 series).
			if c.cmd != nil && c.cmd.Process != nil && !closed(c.exited) {
				rows = append(rows, metricsRow{run.pod.Namespace, run.pod.Name, name, c.started.Time, c.cmd.Process.Pid})
				groups[c.cmd.Process.Pid] = true
			}
			c.mu.Unlock()
		}
	}
	h.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		return a.namespace+"/"+a.pod+"/"+a.container < b.namespace+"/"+b.pod+"/"+b.container
	})
	used := groupUsage(groups)
	now := time.Now().UnixMilli()

	var b strings.Builder
	family := func(name, kind, help string, samples [][2]string) {
		fmt.Fprintf(&b, "# HELP %s [STABLE] %s\n# TYPE %s %s\n", name, help, name, kind)
		for _, s := range samples {
			fmt.Fprintf(&b, "%s%s %s %d\n", name, s[0], s[1], now)
		}
	}
	labels := func(r metricsRow) string {
		return fmt.Sprintf("{container=%q,namespace=%q,pod=%q}", r.container, r.namespace, r.pod)
	}
	perContainer := func(value func(metricsRow, usage) string) [][2]string {
		var out [][2]string
		for _, r := range rows {
			out = append(out, [2]string{labels(r), value(r, used[r.group])})
		}
		return out
	}
	family("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the container in core-seconds",
		perContainer(func(_ metricsRow, u usage) string { return strconv.FormatFloat(u.cpuSeconds, 'g', -1, 64) }))
	family("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes",
		perContainer(func(_ metricsRow, u usage) string { return strconv.FormatUint(u.memoryBytes, 10) }))
	family("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds",
		perContainer(func(r metricsRow, _ usage) string {
			return strconv.FormatFloat(float64(r.started.UnixNano())/1e9, 'f', -1, 64)
		}))
	var node usage
	for _, r := range rows {
		u := used[r.group]
		node.cpuSeconds += u.cpuSeconds
		node.memoryBytes += u.memoryBytes
	}
	family("node_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the node in core-seconds",
		[][2]string{{"", strconv.FormatFloat(node.cpuSeconds, 'g', -1, 64)}})
	family("node_memory_working_set_bytes", "gauge", "Current working set of the node in bytes",
		[][2]string{{"", strconv.FormatUint(node.memoryBytes, 10)}})
	fmt.Fprintf(&b, "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error 0\n")

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
