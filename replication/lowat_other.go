//go:build !linux

package replication

import (
	"errors"
	"syscall"
)

// setRcvLowat is Linux-only: elsewhere SO_RCVLOWAT does not hold back
// poll readiness, so reads stay plain.
func setRcvLowat(syscall.RawConn, int) error {
	return errors.ErrUnsupported
}
