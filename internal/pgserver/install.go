package pgserver

// Finding the server's programs (Debian's packages, or TAILER_PG_VERSION's
// npm build), the user to run them as, and a port no other test holds.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// CopyInitdb makes Start copy a data directory initdb made once (for the
// same programs and options) instead of running initdb for each server,
// until stop, which removes those directories. A test binary that starts
// many servers turns it on for its run (pgtest.Main).
func CopyInitdb() (stop func()) {
	pristine.Lock()
	pristine.on = true
	pristine.Unlock()
	return func() {
		pristine.Lock()
		defer pristine.Unlock()
		pristine.on = false
		for _, d := range pristine.dirs {
			os.RemoveAll(filepath.Dir(d))
		}
		pristine.dirs = nil
	}
}

// BinDir finds PostgreSQL's server programs: $TAILER_PG_BINDIR; for
// $TAILER_PG_VERSION (15, 16, 17 or 18) those scripts/pg-install.sh
// installs (once); else the directory of initdb on PATH, or the newest
// /usr/lib/postgresql/*/bin.
func BinDir() (string, error) {
	if d := os.Getenv("TAILER_PG_BINDIR"); d != "" {
		return d, nil
	}
	if v := os.Getenv("TAILER_PG_VERSION"); v != "" {
		return versionBinDir(v)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("PostgreSQL server programs not found: install postgresql (Debian) or set TAILER_PG_BINDIR")
}

// Major returns the major version of the server programs BinDir finds,
// so that a test for one version skips before it starts a server.
func Major() (int, error) {
	bin, err := BinDir()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("postgres --version: %w", err)
	}
	// "postgres (PostgreSQL) 17.4 (Debian 17.4-1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return 0, fmt.Errorf("postgres --version: unexpected %q", out)
	}
	major, _, _ := strings.Cut(fields[2], ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0, fmt.Errorf("postgres --version: unexpected %q", out)
	}
	return n, nil
}

var installed struct {
	sync.Mutex
	dirs map[string]string
}

// versionBinDir installs PostgreSQL version with scripts/pg-install.sh,
// once per process, and returns its programs' directory.
func versionBinDir(version string) (string, error) {
	installed.Lock()
	defer installed.Unlock()
	if d, ok := installed.dirs[version]; ok {
		return d, nil
	}
	_, file, _, _ := runtime.Caller(0)
	// internal/pgserver: the repository is two levels up.
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "pg-install.sh")
	var stderr strings.Builder
	cmd := exec.Command("bash", script, version)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("TAILER_PG_VERSION=%s: scripts/pg-install.sh: %v: %s", version, err, stderr.String())
	}
	if installed.dirs == nil {
		installed.dirs = map[string]string{}
	}
	installed.dirs[version] = strings.TrimSpace(string(out))
	return installed.dirs[version], nil
}

// credential returns who the server must run as: nil unless we are root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := os.Getenv("TAILER_PG_USER")
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root needs an unprivileged user for PostgreSQL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// givenPorts are the ports FreePort has returned (or found taken), each with
// the lock file that keeps it ours while this process lives.
var givenPorts sync.Map

// FreePort returns a loopback TCP port that was free a moment ago and that
// no other test process is handed until this one exits. It is chosen below
// Linux's ephemeral range (32768-60999), where port 0 listeners of other
// processes land: a test that stops a server and starts it again on the
// same port must not find someone else's server there in between.
//
// go test runs several test binaries at once, and a port free when one of
// them looked can be taken by another's server before the first server
// binds it ("Address already in use" from pg_ctl start). So each port is
// claimed with an flock on a file named for it in a directory the test
// processes share; the kernel drops the lock when the process ends, however
// it ends.
func FreePort() (int, error) {
	dir := filepath.Join(os.TempDir(), "tailer-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	for i := 0; i < 200; i++ {
		port := 20000 + rand.IntN(12000)
		if _, taken := givenPorts.LoadOrStore(port, nil); taken {
			continue
		}
		lock, err := claimPort(dir, port)
		if err != nil {
			return 0, err
		}
		if lock == nil {
			continue
		}
		// Kept reachable, or its finalizer would close the file and let go
		// of the claim.
		givenPorts.Store(port, lock)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port in 20000-31999")
}

// claimPort takes port's lock file in dir, or returns nil if another
// process holds it.
func claimPort(dir string, port int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("free port: claim %d: %w", port, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("free port: claim %d: %w", port, err)
	}
	return f, nil
}
