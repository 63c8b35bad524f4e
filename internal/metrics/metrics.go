// Package metrics defines DSec's Prometheus metrics: sandboxes by tier and
// state, create and exec latency, API request latency and errors by code.
// Metrics live on a registry the caller owns; nothing is global.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Metrics holds the collectors. It is safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry
	create   *prometheus.HistogramVec
	exec     *prometheus.HistogramVec
	request  *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// latency buckets from 50 µs (a function call) to 2 min (a VM boot).
var buckets = prometheus.ExponentialBucketsRange(50e-6, 120, 24)

// New registers DSec's metrics, the Go runtime's and the process's on a
// new registry. counts reports live sandbox counts by (tier, state).
func New(counts func() map[[2]string]int) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_sandbox_create_seconds", Help: "Time to create a sandbox, by tier and outcome.", Buckets: buckets,
		}, []string{"tier", "outcome"}),
		exec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_exec_seconds", Help: "Time to run a command (a function call on the function tier), by tier and outcome.", Buckets: buckets,
		}, []string{"tier", "outcome"}),
		request: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_api_request_seconds", Help: "API request latency by route, method and status code.", Buckets: buckets,
		}, []string{"route", "method", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_api_errors_total", Help: "API errors by error code.",
		}, []string{"code"}),
	}
	m.Registry.MustRegister(m.create, m.exec, m.request, m.errors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&sandboxCollector{counts: counts})
	return m
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return string(errdefs.ClassOf(err))
}

// Created implements controlplane.Observer.
func (m *Metrics) Created(tier string, d time.Duration, err error) {
	m.create.WithLabelValues(tier, outcome(err)).Observe(d.Seconds())
}

// Executed implements controlplane.Observer.
func (m *Metrics) Executed(tier string, d time.Duration, err error) {
	m.exec.WithLabelValues(tier, outcome(err)).Observe(d.Seconds())
}

// Request records one API request.
func (m *Metrics) Request(route, method, code string, d time.Duration) {
	m.request.WithLabelValues(route, method, code).Observe(d.Seconds())
}

// Error counts an API error by its code.
func (m *Metrics) Error(code string) { m.errors.WithLabelValues(code).Inc() }

var sandboxesDesc = prometheus.NewDesc("dsec_sandboxes", "Sandboxes by tier and state.", []string{"tier", "state"}, nil)

// sandboxCollector reads counts at scrape time rather than keeping gauges
// in step with every transition.
type sandboxCollector struct{ counts func() map[[2]string]int }

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	if c.counts == nil {
		return
	}
	for k, v := range c.counts() {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(v), k[0], k[1])
	}
}
