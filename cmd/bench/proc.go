package main

// The tailer under measurement, run as a child process, and what /proc
// says about it and the machine.

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clkTck is the unit of utime and stime in /proc/<pid>/stat on Linux.
const clkTck = 100

// child is a running tailer.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startTailer(o options, url, natsURL, slot string, env ...string) (*child, error) {
	logPath := filepath.Join(o.dir, slot+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	httpAddr := ""
	if o.cpuProfile != "" || o.keep {
		httpAddr = "127.0.0.1:19999"
	}
	cmd := exec.Command(o.tailer, "run", "--http-addr="+httpAddr, "--pprof="+strconv.FormatBool(o.cpuProfile != ""))
	cmd.Env = append(os.Environ(),
		"MAILROOM_DATABASE_URL="+url,
		"MAILROOM_SECRET_KEY="+key,
		"MAILROOM_NATS_URL="+natsURL,
		"MAILROOM_SLOT="+slot,
		"MAILROOM_LOG_LEVEL="+logLevel(),
	)
	cmd.Env = append(cmd.Env, env...)
	if o.tailerEnv != "" {
		cmd.Env = append(cmd.Env, strings.Split(o.tailerEnv, ",")...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); logf.Close(); close(c.done) }()
	return c, nil
}

func (c *child) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

func fetchProfile(path, url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// logLevel lets a developer see the tailer's debug logs in the bench's
// temporary directory (BENCH_LOG_LEVEL=debug, with -keep).
func logLevel() string {
	if l := os.Getenv("BENCH_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}

// cpuSeconds reads utime+stime of pid from /proc.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clkTck, nil
}

// runqueueSeconds reads how long pid has waited for a CPU while runnable,
// from /proc/<pid>/schedstat.
func runqueueSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseFloat(f[1], 64)
	return ns / 1e9
}

// stealMeter starts measuring steal time; the function it returns gives
// the steal since then as % of all CPU time, from /proc/stat.
func stealMeter() func() float64 {
	read := func() (steal, total float64) {
		data, _ := os.ReadFile("/proc/stat")
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			// guest and guest_nice (10th and 11th) are already in user.
			if i < 8 {
				total += x
			}
			if i == 7 {
				steal = x
			}
		}
		return steal, total
	}
	s0, t0 := read()
	return func() float64 {
		s1, t1 := read()
		if t1 == t0 {
			return 0
		}
		return 100 * (s1 - s0) / (t1 - t0)
	}
}

// readSyscalls reads syscr, the number of read-like system calls of pid.
func readSyscalls(pid int) int64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// peakRSS reads VmHWM of pid in MiB.
func peakRSS(pid int) float64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func machine() string {
	host, _ := os.Hostname()
	cpus := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(data), "processor\t:")
	}
	return fmt.Sprintf("%s, %d CPUs", host, cpus)
}
