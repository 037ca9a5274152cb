// Command go_latency consumes a topic with go-nsq v1.1.0 and measures, per message, the
// time from its publish (the body's second field, Unix seconds as written by
// bench/bench_latency.py) to the handler's call. It is the Go side of that benchmark.
//
//	go_latency -nsqd 127.0.0.1:4150 -topic t -channel c -n 30000 -from 1000
//
// It prints "ready" once subscribed, then one JSON line when n messages came: how many,
// and the latencies (seconds) of those whose sequence number (the body's first field) is
// at least -from, as the sorted list's p50, p99 and max.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nsqio/go-nsq"
)

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

func main() {
	addr := flag.String("nsqd", "127.0.0.1:4150", "nsqd TCP address")
	topic := flag.String("topic", "bench", "topic")
	channel := flag.String("channel", "bench", "channel")
	n := flag.Int("n", 1000, "messages to consume")
	from := flag.Int64("from", 0, "measure messages with this sequence number and up")
	maxInFlight := flag.Int("max-in-flight", 2500, "max in flight")
	obt := flag.Duration("output-buffer-timeout", 0, "IDENTIFY output_buffer_timeout (0: go-nsq's default)")
	timeout := flag.Duration("timeout", 300*time.Second, "give up after")
	flag.Parse()

	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	if *obt > 0 {
		cfg.OutputBufferTimeout = *obt
	}
	c, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatal(err)
	}
	c.SetLogger(log.New(io.Discard, "", 0), nsq.LogLevelError)
	var mu sync.Mutex
	latencies := make([]float64, 0, *n)
	count := 0
	done := make(chan struct{})
	c.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		now := float64(time.Now().UnixNano()) / 1e9
		fields := bytes.SplitN(m.Body, []byte(" "), 3)
		seq, _ := strconv.ParseInt(string(fields[0]), 10, 64)
		at, _ := strconv.ParseFloat(string(fields[1]), 64)
		mu.Lock()
		if seq >= *from {
			latencies = append(latencies, now-at)
		}
		count++
		if count == *n {
			close(done)
		}
		mu.Unlock()
		return nil
	}))
	if err := c.ConnectToNSQD(*addr); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready")
	select {
	case <-done:
	case <-time.After(*timeout):
		log.Printf("timeout after %d messages", count)
	}
	c.Stop()
	<-c.StopChan
	mu.Lock()
	defer mu.Unlock()
	sort.Float64s(latencies)
	max := math.NaN()
	if len(latencies) > 0 {
		max = latencies[len(latencies)-1]
	}
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
		"consumer": "go-nsq v1.1.0", "messages": count, "measured": len(latencies),
		"p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99), "max_s": max,
	})
}
