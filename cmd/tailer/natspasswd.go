package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
)

func (x *cli) natsPasswdCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "nats-passwd",
		Short: "print the bcrypt hash of a NATS user's password read from stdin",
		Long: `Read a NATS user's password from stdin, as a password file holds it (one
line end taken off), and print its bcrypt hash for the server's
configuration: the compose stack's nats-auth runs it with each password
file on stdin, so that no password is on a command line or in an
environment (nats server passwd takes it in either).`,
		Example: `  tailer nats-passwd </run/secrets/nats_tailer_password >/auth/tailer.bcrypt`,
	}
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		b, err := io.ReadAll(io.LimitReader(c.InOrStdin(), 1<<10))
		if err != nil {
			fmt.Fprintf(x.stderr, "tailer nats-passwd: read stdin: %v\n", err)
			return exitFailure
		}
		h, err := natsconn.HashPassword(config.FileValue(b))
		if err != nil {
			fmt.Fprintf(x.stderr, "tailer nats-passwd: %v; give the password on stdin (tailer nats-passwd <FILE)\n", err)
			return exitConfig
		}
		fmt.Fprintln(x.stdout, h)
		return exitOK
	})
}
