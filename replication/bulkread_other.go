//go:build !linux

package replication

import (
	"errors"
	"syscall"
)

// setRcvLowat is Linux-only: the bulk reads were tuned there alone, so
// elsewhere reads stay plain.
func setRcvLowat(syscall.RawConn, int) error {
	return errors.ErrUnsupported
}
