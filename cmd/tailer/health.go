package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
)

func (x *cli) healthCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "health",
		Short: "exit 0 when the running tailer's /readyz says ready (for container healthchecks)",
		Long: `Ask the tailer (or, with --http-addr, a subscriber) serving /readyz on
MAILROOM_HTTP_ADDR whether it is ready, and print its answer: exit 0 when
it is, 1 when it is not or does not answer. The container healthcheck of
an image without curl.`,
	}
	load := x.settings(c, healthVars, false)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return health(c.Context(), cfg, x.stdout, x.stderr)
	})
}

// health asks the tailer at MAILROOM_HTTP_ADDR whether it is ready.
func health(ctx context.Context, cfg *config.Config, stdout, stderr io.Writer) int {
	if cfg.HTTPAddr == "" {
		fmt.Fprintln(stderr, "tailer health: MAILROOM_HTTP_ADDR is empty: the tailer serves no /readyz")
		return exitConfig
	}
	host, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		fmt.Fprintf(stderr, "tailer health: MAILROOM_HTTP_ADDR: %v\n", err)
		return exitConfig
	}
	// A wildcard listen address is reached on loopback.
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		fmt.Fprintf(stderr, "tailer health: %v\n", err)
		return exitFailure
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		fmt.Fprintf(stderr, "tailer health: nothing answers at %s (MAILROOM_HTTP_ADDR, or --http-addr): is tailer run, or the subscriber asked, running with this setting? (%v)\n", req.URL, err)
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Fprint(stdout, string(body))
	if resp.StatusCode != http.StatusOK {
		return exitFailure
	}
	return exitOK
}
