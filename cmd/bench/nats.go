package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/pgserver"
)

// tailerNATS says where the tailer of a run publishes. With o.nats
// "embedded" and one replica, to its own server in its process, as
// deployed by default: env tells the tailer where that server listens and
// stores, and natsURL is where the bench reads it once the tailer runs.
// Otherwise to startNATS's server or cluster in this process, whose URLs
// are both external (the tailer's MAILROOM_NATS_URL) and natsURL.
func tailerNATS(o options, slot string) (env []string, external, natsURL string, stop func(), err error) {
	if o.nats == "bench" || o.natsReplicas > 1 {
		urls, stop, err := startNATS(o, slot)
		return nil, urls, urls, stop, err
	}
	port, err := pgserver.FreePort()
	if err != nil {
		return nil, "", "", nil, err
	}
	env = []string{fmt.Sprintf("MAILROOM_NATS_LISTEN=127.0.0.1:%d", port), "MAILROOM_DATA_DIR=" + filepath.Join(o.dir, "data-"+slot)}
	if o.natsSync > 0 {
		env = append(env, "MAILROOM_NATS_SYNC="+o.natsSync.String())
	}
	return env, "", fmt.Sprintf("nats://127.0.0.1:%d", port), func() {}, nil
}

// connectNATS connects to natsURL, waiting while t runs for a tailer's own
// server to listen (up to 30 s).
func connectNATS(t *child, natsURL string) (*nats.Conn, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		nc, err := nats.Connect(natsURL)
		if err == nil {
			return nc, nil
		}
		select {
		case <-t.done:
			log, _ := os.ReadFile(t.log)
			return nil, fmt.Errorf("tailer exited:\n%s", log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("NATS at %s: %w", natsURL, err)
		}
	}
}

// startNATS runs the JetStream the tailer publishes to: one embedded
// server, or with -nats-replicas 3 a cluster of three nodes in this process
// (the stream is then created R3). It returns the client URLs, comma-joined.
func startNATS(o options, name string) (urls string, stop func(), err error) {
	if o.natsReplicas <= 1 {
		srv, err := embedded.Start(filepath.Join(o.dir, "nats-"+name), "127.0.0.1:0", embedded.SyncInterval(o.natsSync))
		if err != nil {
			return "", nil, err
		}
		return srv.ClientURL(), srv.Shutdown, nil
	}
	var client, cluster [3]int
	for i := range 3 {
		if client[i], err = pgserver.FreePort(); err != nil {
			return "", nil, err
		}
		if cluster[i], err = pgserver.FreePort(); err != nil {
			return "", nil, err
		}
	}
	var nodes []*server.Server
	stop = func() {
		for _, s := range nodes {
			s.Shutdown()
		}
	}
	var list []string
	for i := range 3 {
		var routes []*url.URL
		for j := range 3 {
			if j != i {
				routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", cluster[j])})
			}
		}
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: client[i],
			JetStream: true, StoreDir: filepath.Join(o.dir, fmt.Sprintf("nats-%s-%d", name, i)), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: cluster[i]},
			Routes:  routes,
		}
		embedded.SyncInterval(o.natsSync)(opts)
		if o.natsSync <= 0 {
			opts.SyncAlways = true
		}
		s, err := server.NewServer(opts)
		if err != nil {
			stop()
			return "", nil, err
		}
		s.Start()
		nodes = append(nodes, s)
		if !s.ReadyForConnections(15 * time.Second) {
			stop()
			return "", nil, fmt.Errorf("NATS node %d not ready", i+1)
		}
		list = append(list, s.ClientURL())
	}
	urls = strings.Join(list, ",")
	// The tailer would retry until the cluster has a meta leader; waiting
	// here keeps that out of the measured drain.
	nc, err := nats.Connect(urls)
	if err != nil {
		stop()
		return "", nil, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for deadline := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return urls, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("NATS cluster has no JetStream leader: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
