package pgserver

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestFreePortIsClaimedAcrossProcesses: a port one process was given is
// not another's to take while the first lives, and is free again once it
// has exited.
func TestFreePortIsClaimedAcrossProcesses(t *testing.T) {
	if os.Getenv("PGTEST_PORT_CHILD") == "1" {
		port, err := FreePort()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(port)
		// Holds the port until the parent closes stdin.
		bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	dir := filepath.Join(os.TempDir(), "tailer-test-ports")

	mine, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if lock, err := claimPort(dir, mine); err != nil || lock != nil {
		t.Fatalf("port %d, given to this process, claimed again: %v, %v", mine, lock, err)
	}

	child := exec.Command(os.Args[0], "-test.run=^TestFreePortIsClaimedAcrossProcesses$")
	child.Env = append(os.Environ(), "PGTEST_PORT_CHILD=1")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v (read %q)", err, line)
	}
	theirs, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		t.Fatalf("child said %q", line)
	}
	if lock, err := claimPort(dir, theirs); err != nil || lock != nil {
		t.Fatalf("port %d, held by a live child, claimed here: %v, %v", theirs, lock, err)
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	lock, err := claimPort(dir, theirs)
	if err != nil || lock == nil {
		t.Fatalf("port %d not free to claim after its holder exited: %v, %v", theirs, lock, err)
	}
	lock.Close()
}
