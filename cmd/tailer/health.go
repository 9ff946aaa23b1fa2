package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// health asks the tailer at MAILROOM_HTTP_ADDR whether it is ready: the
// container healthcheck of an image without curl.
func health(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	cfg, _, code := loadConfig("health", healthVars, args, lookupEnv, stderr)
	if cfg == nil {
		return code
	}
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
		fmt.Fprintf(stderr, "tailer health: %v\n", err)
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
