package main

import (
	"bufio"
	cryptotls "crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mailroom/tailer/internal/testutil/certtest"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// The cluster file's nodes, run for real with nats/cluster.conf (and
// cluster-tls.conf): three form a cluster through routes that log in with
// the route password, whatever characters it holds; a server with the
// cluster's name and the wrong password, or none, is not let in; and with
// the TLS file the route port takes TLS only.
func TestNATSClusterRoutes(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(38, uint64(time.Now().UnixNano())))
	for _, conf := range []string{"cluster.conf", "cluster-tls.conf"} {
		// Drawn here: the subtests run at once, and rng is not safe for that.
		pw := hostilePassword(rng)
		t.Run(conf, func(t *testing.T) {
			t.Parallel()
			path := infra + "nats/" + conf
			tls := conf == "cluster-tls.conf"
			var routeTLS *cryptotls.Config
			if tls {
				path, routeTLS = withTestCerts(t, path)
			}
			users := map[string]string{"TAILER": "t", "SUBSCRIBER": "s", "ADMIN": "a", "SYSTEM": "y"}
			hosts := []string{"node-1", "node-2", "node-3"}
			routePorts := map[string]int{}
			for _, h := range append(hosts, "intruder") {
				routePorts[h] = freePort(t)
			}
			node := func(name string, routePW string) *server.Server {
				users["ROUTE"] = routePW
				opts, err := server.ProcessConfigFile(natsConfig(t, path, users, "NATS_ROUTE_HOSTS="+strings.Join(hosts, " ")))
				if err != nil {
					t.Fatal(err)
				}
				if len(opts.Routes) != len(hosts) || opts.Cluster.Username != "route" || opts.Cluster.Password != routePW {
					t.Fatalf("%s: routes %v, cluster user %q", conf, opts.Routes, opts.Cluster.Username)
				}
				// The hosts' names, resolved as compose's network would.
				for _, u := range opts.Routes {
					u.Host = "127.0.0.1:" + strconv.Itoa(routePorts[u.Hostname()])
				}
				opts.ServerName, opts.Host, opts.Port, opts.HTTPPort = name, "127.0.0.1", freePort(t), 0
				opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", routePorts[name]
				opts.StoreDir, opts.NoSigs, opts.NoLog = t.TempDir(), true, true
				s, err := server.NewServer(opts)
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				t.Cleanup(s.Shutdown)
				if !s.ReadyForConnections(10 * time.Second) {
					t.Fatalf("%s with %s not ready", name, conf)
				}
				return s
			}
			var nodes []*server.Server
			for _, h := range hosts {
				nodes = append(nodes, node(h, pw))
			}
			tailertest.Eventually(t, 20*time.Second, func() error {
				for i, s := range nodes {
					if got := peers(t, s); len(got) != 2 {
						return fmt.Errorf("%s is routed to %v, want the other two", hosts[i], got)
					}
				}
				return nil
			})
			intruder := node("intruder", pw+"x")
			// Routes are retried every second: three rounds are enough to
			// have let it in, were it let in.
			time.Sleep(3 * time.Second)
			if got := peers(t, intruder); len(got) != 0 {
				t.Errorf("a server with the wrong route password is routed to %v", got)
			}
			for i, s := range nodes {
				if got := peers(t, s); len(got) != 2 {
					t.Errorf("%s is routed to %v: the intruder got in", hosts[i], got)
				}
			}
			// Over TLS the route port says nothing in the clear: it waits
			// for a TLS handshake, which a node's certificate completes.
			info, err := routeInfo(routePorts["node-1"], nil)
			if tls {
				if err == nil {
					t.Errorf("%s: the route port answers in the clear: %q", conf, info)
				}
				if info, err := routeInfo(routePorts["node-1"], routeTLS); err != nil || !strings.HasPrefix(info, "INFO ") {
					t.Errorf("%s: the route port over TLS: %q, %v", conf, info, err)
				}
			} else if err != nil || !strings.HasPrefix(info, "INFO ") || strings.Contains(info, "tls_required") {
				t.Errorf("%s: the route port says %q (%v)", conf, info, err)
			}
		})
	}
}

// peers are the servers s has routes to, by name.
func peers(t *testing.T, s *server.Server) map[string]bool {
	t.Helper()
	rz, err := s.Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range rz.Routes {
		names[r.RemoteName] = true
	}
	return names
}

// routeInfo is the first line a route port sends, in the clear or, with
// cfg, over TLS.
func routeInfo(port int, cfg *cryptotls.Config) (string, error) {
	d := &net.Dialer{Timeout: 3 * time.Second}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var c net.Conn
	var err error
	if cfg != nil {
		c, err = cryptotls.DialWithDialer(d, "tcp", addr, cfg)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

// withTestCerts copies conf and the nats.conf it includes into a
// temporary directory, with the compose secrets' certificate paths
// replaced by a test CA's: a server certificate for 127.0.0.1, which the
// routes dial. It returns the copy, and what a node dials a route with.
func withTestCerts(t *testing.T, conf string) (string, *cryptotls.Config) {
	t.Helper()
	dir := t.TempDir()
	certs := certtest.Write(t, dir, "routes")
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer("/run/secrets/nats_tls_cert", certs.ServerCert, "/run/secrets/nats_tls_key", certs.ServerKey, "/run/secrets/tls_ca", certs.CA)
	out := filepath.Join(dir, filepath.Base(conf))
	if err := os.WriteFile(out, []byte(r.Replace(string(data))), 0o600); err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(filepath.Dir(conf), "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), base, 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := cryptotls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return out, &cryptotls.Config{Certificates: []cryptotls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1"}
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nats/entrypoint.sh refuses a node with route hosts and no route
// password: cluster.conf would otherwise read an empty one.
func TestNATSEntrypointRoutesNeedPassword(t *testing.T) {
	t.Parallel()
	pw := secretFile(t, "pw")
	cmd := exec.Command("sh", infra+"nats/entrypoint.sh", "true")
	cmd.Env = append(os.Environ(), "NATS_TAILER_PASSWORD_FILE="+pw, "NATS_SUBSCRIBER_PASSWORD_FILE="+pw,
		"NATS_ADMIN_PASSWORD_FILE="+pw, "NATS_SYSTEM_PASSWORD_FILE="+pw, "NATS_ROUTE_HOSTS=nats nats-2 nats-3", "NATS_CONFIG_COPY="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "NATS_ROUTE_PASSWORD") {
		t.Fatalf("entrypoint with route hosts and no route password: %v\n%s", err, out)
	}
}
