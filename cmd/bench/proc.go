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

	"github.com/mailroom/tailer/internal/pgserver"
)

// clkTck is the unit of utime and stime in /proc/<pid>/stat on Linux.
const clkTck = 100

// child is a running tailer.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	// http is where it serves /metrics (and /debug/pprof when profiled),
	// as a tailer at the defaults does.
	http string
}

func startTailer(o options, url, natsURL, slot string, env ...string) (*child, error) {
	// A slot's tailer started again logs beside the first.
	logPath := filepath.Join(o.dir, slot+".log")
	for i := 2; fileExists(logPath); i++ {
		logPath = filepath.Join(o.dir, fmt.Sprintf("%s-%d.log", slot, i))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	port, err := pgserver.FreePort()
	if err != nil {
		return nil, err
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(port)
	profile := o.cpuProfile != "" || o.liveProfile != ""
	cmd := exec.Command(o.tailer, "run", "--http-addr="+httpAddr, "--pprof="+strconv.FormatBool(profile))
	cmd.Env = append(os.Environ(),
		"MAILROOM_DATABASE_URL="+url,
		"MAILROOM_SECRET_KEY="+key,
		"MAILROOM_SLOT="+slot,
		"MAILROOM_LOG_LEVEL="+logLevel(),
	)
	if natsURL != "" {
		// Empty: the tailer runs its embedded server, as deployed by
		// default (MAILROOM_NATS_LISTEN and MAILROOM_DATA_DIR in env).
		cmd.Env = append(cmd.Env, "MAILROOM_NATS_URL="+natsURL)
	}
	cmd.Env = append(cmd.Env, env...)
	if o.tailerEnv != "" {
		cmd.Env = append(cmd.Env, strings.Split(o.tailerEnv, ",")...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath, http: "http://" + httpAddr}
	go func() { cmd.Wait(); logf.Close(); close(c.done) }()
	return c, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
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
	t0 := readCPUTimes()
	return func() float64 {
		t1 := readCPUTimes()
		if t1.total == t0.total {
			return 0
		}
		return 100 * (t1.steal - t0.steal) / (t1.total - t0.total)
	}
}

// cpuTimes are the machine's CPU times, all CPUs together, from the first
// line of /proc/stat: in all, busy (neither idle nor waiting for I/O), and
// stolen by the hypervisor.
type cpuTimes struct{ total, busy, steal float64 }

func readCPUTimes() cpuTimes {
	var t cpuTimes
	data, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return t
	}
	for i, v := range f[1:] {
		// user nice system idle iowait irq softirq steal; guest and
		// guest_nice, after them, are already in user.
		if i >= 8 {
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		t.total += x
		if i != 3 && i != 4 {
			t.busy += x
		}
		if i == 7 {
			t.steal = x
		}
	}
	return t
}

// Load is where the machine's CPU went during a live run's writing.
type Load struct {
	// BusyPct is the time all CPUs were busy (not idle, not waiting for
	// I/O), as a percent of all CPU time.
	BusyPct float64 `json:"machine_busy_percent"`
	// Tailer, Bench (this process: the NATS server, the writers, the
	// subscriber) and Postgres (all its processes).
	Tailer   ProcLoad `json:"tailer"`
	Bench    ProcLoad `json:"bench_nats_writers_subscriber"`
	Postgres ProcLoad `json:"postgres"`
}

// ProcLoad is a group of processes' share of a run, summed over their
// threads and divided by the run's wall time.
type ProcLoad struct {
	Cores float64 `json:"cpu_cores"`
	// Wait is the time the threads were ready to run but waited for a
	// CPU, seconds a second: the scheduling delay every wakeup on the
	// latency path pays.
	Wait float64 `json:"runqueue_wait_seconds_per_second"`
	// Slices is how many times a second the threads got a CPU.
	Slices float64 `json:"timeslices_per_second"`
}

// loadMeter starts measuring the machine and the processes of tailerPID
// (0: none), this one and PostgreSQL's; the function it returns gives the
// load since then.
func loadMeter(tailerPID int) func() Load {
	groups := func() [3]schedTotals {
		var g [3]schedTotals
		if tailerPID > 0 {
			g[0] = schedOf([]int{tailerPID})
		}
		g[1] = schedOf([]int{os.Getpid()})
		g[2] = schedOf(postgresPIDs())
		return g
	}
	c0, g0, start := readCPUTimes(), groups(), time.Now()
	return func() Load {
		c1, g1, secs := readCPUTimes(), groups(), time.Since(start).Seconds()
		l := Load{}
		if c1.total > c0.total {
			l.BusyPct = 100 * (c1.busy - c0.busy) / (c1.total - c0.total)
		}
		share := func(i int) ProcLoad {
			return ProcLoad{Cores: (g1[i].cpu - g0[i].cpu) / secs, Wait: (g1[i].wait - g0[i].wait) / secs, Slices: (g1[i].slices - g0[i].slices) / secs}
		}
		l.Tailer, l.Bench, l.Postgres = share(0), share(1), share(2)
		return l
	}
}

// schedTotals is CPU time and run-queue wait in seconds, and timeslices,
// summed over threads.
type schedTotals struct{ cpu, wait, slices float64 }

// schedOf sums /proc/<pid>/task/*/schedstat over pids' threads. Threads
// that end between two readings drop out of the second; the runs measured
// keep theirs.
func schedOf(pids []int) schedTotals {
	var t schedTotals
	for _, pid := range pids {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
			if err != nil {
				continue
			}
			f := strings.Fields(string(data))
			if len(f) < 3 {
				continue
			}
			cpu, _ := strconv.ParseFloat(f[0], 64)
			wait, _ := strconv.ParseFloat(f[1], 64)
			n, _ := strconv.ParseFloat(f[2], 64)
			t.cpu, t.wait, t.slices = t.cpu+cpu/1e9, t.wait+wait/1e9, t.slices+n
		}
	}
	return t
}

// postgresPIDs lists the processes named postgres: the server the bench
// started is the only one on the machine it is meant for.
func postgresPIDs() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			pids = append(pids, pid)
		}
	}
	return pids
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
