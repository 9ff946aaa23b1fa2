package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/mailroom/tailer/cmd/internal/config"
)

// Readiness is the body of /readyz.
type Readiness struct {
	Ready         bool     `json:"ready"`
	Reasons       []string `json:"reasons,omitempty"`
	SlotHeld      bool     `json:"slot_held"`
	NATSConnected bool     `json:"nats_connected"`
	LagBytes      *int64   `json:"lag_bytes"`
	MaxLagBytes   int64    `json:"max_lag_bytes"`
}

func (d *Daemon) readiness() Readiness {
	r := Readiness{SlotHeld: d.held.Load(), MaxLagBytes: d.cfg.MaxLag}
	if nc := d.nc.Load(); nc != nil {
		r.NATSConnected = nc.IsConnected()
	}
	if b := d.blocked.Load(); b != nil {
		r.Reasons = append(r.Reasons, *b)
	} else if s := d.standby.Load(); s != nil && !r.SlotHeld {
		r.Reasons = append(r.Reasons, *s)
	} else if !r.SlotHeld {
		r.Reasons = append(r.Reasons, "not streaming from the slot (standing by or reconnecting)")
	}
	if !r.NATSConnected {
		r.Reasons = append(r.Reasons, "not connected to NATS")
	}
	if reason := d.pubAckWaitReason(); reason != "" {
		r.Reasons = append(r.Reasons, reason)
	}
	if reason := d.auditReason(); reason != "" {
		r.Reasons = append(r.Reasons, reason)
	}
	switch s := d.lag.Load(); {
	case s == nil:
		r.Reasons = append(r.Reasons, "slot lag not sampled yet")
	case s.err != nil:
		r.Reasons = append(r.Reasons, "slot lag unknown: "+s.err.Error())
	case s.slot.Lost():
		r.Reasons = append(r.Reasons, LostSlotMessage(s.slot))
	default:
		lag := s.slot.LagBytes()
		r.LagBytes = &lag
		if lag > d.cfg.MaxLag {
			r.Reasons = append(r.Reasons, fmt.Sprintf("slot lag %d bytes exceeds %d", lag, d.cfg.MaxLag))
		}
	}
	r.Ready = len(r.Reasons) == 0
	return r
}

// pubAckSaid is how long a publish may await its PubAck before /readyz
// says so: a stream's sync to disk takes milliseconds, a leader elected
// after a node's loss seconds.
const pubAckSaid = time.Second

// pubAckWaitReason says, once a publish has awaited its PubAck longer than
// pubAckSaid, how long, from which stream and leader, and what ends it.
func (d *Daemon) pubAckWaitReason() string {
	p := d.publishing.Load()
	if p == nil {
		return ""
	}
	w := p.pipe.PubAckWait()
	if w <= pubAckSaid {
		return ""
	}
	leader := ""
	if l := p.pub.Leader(); l != "" {
		leader = " (led by " + l + " when last looked at)"
	}
	return fmt.Sprintf("a publish has awaited its PubAck from stream %s%s for %.1f s: the session starts again, on whichever server leads the stream then, at MAILROOM_PUBACK_TIMEOUT (%s)",
		d.cfg.Stream, leader, w.Seconds(), d.cfg.PubAckTimeout)
}

func (d *Daemon) serveHTTP() (stop func(), err error) {
	ln, err := net.Listen("tcp", d.cfg.HTTPAddr)
	if err != nil {
		// The operator's to fix, as the NATS port in use is: exit 2.
		return nil, &config.Error{Var: "MAILROOM_HTTP_ADDR", Err: fmt.Errorf("%s cannot be listened on (another process holds it: ss -ltnp; give a free host:port, or empty for no endpoint): %w", d.cfg.HTTPAddr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.metrics.Handler())
	if d.cfg.Pprof {
		// Off by default: the metrics address is often reachable by more
		// than the operator, and a profile is cheap to ask for and costly
		// to serve.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		r := d.readiness()
		d.metrics.setReady(r.Ready)
		w.Header().Set("Content-Type", "application/json")
		if !r.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(r)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	d.log.Info("http listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
