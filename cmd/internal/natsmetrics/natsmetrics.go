package natsmetrics

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricNames lists the families Collector exports, which the infra tests
// compare with the dashboard and the alert rules.
var MetricNames = []string{
	"nats_up",
	"nats_healthy",
	"nats_connections",
	"nats_slow_consumers_total",
	"nats_memory_bytes",
	"nats_jetstream_storage_bytes",
	"nats_jetstream_storage_max_bytes",
	"nats_jetstream_api_errors_total",
	"nats_jetstream_meta_leader",
	"nats_jetstream_meta_peers_offline",
	"nats_stream_messages",
	"nats_stream_bytes",
	"nats_stream_last_seq",
	"nats_stream_replicas",
	"nats_stream_replicas_behind",
	"nats_consumer_pending_messages",
	"nats_consumer_ack_pending_messages",
	"nats_consumer_redelivered_messages",
	"nats_consumer_ack_floor_seq",
}

var (
	serverLabels   = []string{"server"}
	streamLabels   = []string{"server", "account", "stream"}
	consumerLabels = []string{"server", "account", "stream", "consumer"}
)

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	upDesc           = desc("nats_up", "1 when the server's monitoring port answered /varz at this scrape.", []string{"server", "url"})
	healthyDesc      = desc("nats_healthy", "1 when the server's /healthz says ok (JetStream up and current).", serverLabels)
	connectionsDesc  = desc("nats_connections", "Client connections to the server.", serverLabels)
	slowDesc         = desc("nats_slow_consumers_total", "Clients the server cut off for reading too slowly.", serverLabels)
	memDesc          = desc("nats_memory_bytes", "Resident memory of the server process.", serverLabels)
	storageDesc      = desc("nats_jetstream_storage_bytes", "JetStream file storage used on the server.", serverLabels)
	storageMaxDesc   = desc("nats_jetstream_storage_max_bytes", "JetStream file storage the server may use (max_file_store).", serverLabels)
	apiErrorsDesc    = desc("nats_jetstream_api_errors_total", "JetStream API requests the server answered with an error.", serverLabels)
	metaLeaderDesc   = desc("nats_jetstream_meta_leader", "1 on the server that leads the JetStream cluster's meta group (a single server leads itself).", serverLabels)
	metaOfflineDesc  = desc("nats_jetstream_meta_peers_offline", "Peers of the meta group that are offline or not current, as its leader sees them.", serverLabels)
	streamMsgsDesc   = desc("nats_stream_messages", "Messages the stream holds.", streamLabels)
	streamBytesDesc  = desc("nats_stream_bytes", "Bytes the stream holds.", streamLabels)
	streamLastDesc   = desc("nats_stream_last_seq", "The stream's last sequence.", streamLabels)
	streamRepsDesc   = desc("nats_stream_replicas", "The replicas the stream is configured with.", streamLabels)
	streamBehindDesc = desc("nats_stream_replicas_behind", "Replicas of the stream that are offline or not current, as its leader sees them.", streamLabels)
	consPendingDesc  = desc("nats_consumer_pending_messages", "Messages of the stream the consumer has not delivered yet.", consumerLabels)
	consAckPendDesc  = desc("nats_consumer_ack_pending_messages", "Messages delivered and not acknowledged yet.", consumerLabels)
	consRedelivDesc  = desc("nats_consumer_redelivered_messages", "Messages delivered more than once and not acknowledged yet.", consumerLabels)
	consAckFloorDesc = desc("nats_consumer_ack_floor_seq", "The stream sequence up to which the consumer has every message acknowledged.", consumerLabels)
	allDescs         = []*prometheus.Desc{upDesc, healthyDesc, connectionsDesc, slowDesc, memDesc, storageDesc, storageMaxDesc, apiErrorsDesc, metaLeaderDesc, metaOfflineDesc, streamMsgsDesc, streamBytesDesc, streamLastDesc, streamRepsDesc, streamBehindDesc, consPendingDesc, consAckPendDesc, consRedelivDesc, consAckFloorDesc}
)

// Collector asks each server's monitoring port at every scrape.
type Collector struct {
	urls    []string
	client  *http.Client
	timeout time.Duration

	mu       sync.Mutex
	answered bool
}

// New returns a Collector of the servers whose monitoring ports are at
// urls (http://host:8222), each asked with timeout.
func New(urls []string, timeout time.Duration) (*Collector, error) {
	if len(urls) == 0 {
		return nil, fmt.Errorf("no monitoring URL")
	}
	for _, u := range urls {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("monitoring URL %q: want http://host:port", u)
		}
	}
	return &Collector{urls: urls, client: &http.Client{}, timeout: timeout}, nil
}

// Answered reports whether any server answered at the last scrape (no
// scrape yet: false).
func (c *Collector) Answered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answered
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: every server at once, each
// within the timeout.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered bool
	)
	for _, u := range c.urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := c.collectServer(ctx, strings.TrimRight(u, "/"), ch)
			mu.Lock()
			answered = answered || ok
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.mu.Lock()
	c.answered = answered
	c.mu.Unlock()
}

// The fields of /varz, /jsz and /healthz that are exported.
type varz struct {
	Name          string  `json:"server_name"`
	Connections   float64 `json:"connections"`
	SlowConsumers float64 `json:"slow_consumers"`
	Mem           float64 `json:"mem"`
}

type replica struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline"`
}

type clusterInfo struct {
	Leader   string    `json:"leader"`
	Replicas []replica `json:"replicas"`
}

// behind counts the replicas that are offline or not current.
func (ci *clusterInfo) behind() float64 {
	n := 0
	for _, r := range ci.Replicas {
		if r.Offline || !r.Current {
			n++
		}
	}
	return float64(n)
}

type jsz struct {
	Config struct {
		MaxStore float64 `json:"max_storage"`
	} `json:"config"`
	Storage float64 `json:"storage"`
	API     struct {
		Errors float64 `json:"errors"`
	} `json:"api"`
	Meta *struct {
		clusterInfo
		Size int `json:"cluster_size"`
	} `json:"meta_cluster"`
	Accounts []struct {
		Name    string `json:"name"`
		Streams []struct {
			Name    string       `json:"name"`
			Cluster *clusterInfo `json:"cluster"`
			Config  struct {
				Replicas float64 `json:"num_replicas"`
			} `json:"config"`
			State struct {
				Msgs    float64 `json:"messages"`
				Bytes   float64 `json:"bytes"`
				LastSeq float64 `json:"last_seq"`
			} `json:"state"`
			Consumers []struct {
				Name        string       `json:"name"`
				Cluster     *clusterInfo `json:"cluster"`
				Pending     float64      `json:"num_pending"`
				AckPending  float64      `json:"num_ack_pending"`
				Redelivered float64      `json:"num_redelivered"`
				AckFloor    struct {
					Stream float64 `json:"stream_seq"`
				} `json:"ack_floor"`
			} `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

// leads reports whether server speaks for something clustered as ci: its
// leader, or the only server there is.
func leads(ci *clusterInfo, server string) bool {
	return ci == nil || ci.Leader == "" || ci.Leader == server
}

// collectServer exports one server, reporting whether it answered.
func (c *Collector) collectServer(ctx context.Context, base string, ch chan<- prometheus.Metric) bool {
	var v varz
	if err := c.get(ctx, base+"/varz", &v); err != nil {
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 0, "", base)
		return false
	}
	s := v.Name
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1, s, base)
	gauge := func(d *prometheus.Desc, x float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, labels...)
	}
	counter := func(d *prometheus.Desc, x float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, x, labels...)
	}
	gauge(connectionsDesc, v.Connections, s)
	counter(slowDesc, v.SlowConsumers, s)
	gauge(memDesc, v.Mem, s)
	healthy := 0.0
	if c.get(ctx, base+"/healthz", &struct{}{}) == nil {
		healthy = 1
	}
	gauge(healthyDesc, healthy, s)

	var j jsz
	if err := c.get(ctx, base+"/jsz?accounts=true&streams=true&consumers=true&config=true", &j); err != nil {
		return true
	}
	gauge(storageDesc, j.Storage, s)
	gauge(storageMaxDesc, j.Config.MaxStore, s)
	counter(apiErrorsDesc, j.API.Errors, s)
	switch {
	case j.Meta == nil || j.Meta.Leader == "":
		// Alone, or a cluster without a meta leader: only the first
		// leads itself.
		lead := 0.0
		if j.Meta == nil || j.Meta.Size <= 1 {
			lead = 1
		}
		gauge(metaLeaderDesc, lead, s)
	case j.Meta.Leader == s:
		gauge(metaLeaderDesc, 1, s)
		gauge(metaOfflineDesc, j.Meta.behind(), s)
	default:
		gauge(metaLeaderDesc, 0, s)
	}
	for _, a := range j.Accounts {
		for _, st := range a.Streams {
			if leads(st.Cluster, s) {
				gauge(streamMsgsDesc, st.State.Msgs, s, a.Name, st.Name)
				gauge(streamBytesDesc, st.State.Bytes, s, a.Name, st.Name)
				gauge(streamLastDesc, st.State.LastSeq, s, a.Name, st.Name)
				gauge(streamRepsDesc, max(st.Config.Replicas, 1), s, a.Name, st.Name)
				behind := 0.0
				if st.Cluster != nil {
					behind = st.Cluster.behind()
				}
				gauge(streamBehindDesc, behind, s, a.Name, st.Name)
			}
			// A consumer's leader need not be its stream's.
			for _, cons := range st.Consumers {
				if !leads(cons.Cluster, s) {
					continue
				}
				gauge(consPendingDesc, cons.Pending, s, a.Name, st.Name, cons.Name)
				gauge(consAckPendDesc, cons.AckPending, s, a.Name, st.Name, cons.Name)
				gauge(consRedelivDesc, cons.Redelivered, s, a.Name, st.Name, cons.Name)
				gauge(consAckFloorDesc, cons.AckFloor.Stream, s, a.Name, st.Name, cons.Name)
			}
		}
	}
	return true
}

// get decodes the JSON at u into v; a status other than 200 is an error.
func (c *Collector) get(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v)
}
