// Command go_consumer drains a topic with go-nsq v1.1.0 and a no-op handler, and prints
// its rate as JSON. It is the Go baseline of bench/bench_consume.py.
//
//	go_consumer -nsqd 127.0.0.1:4150 -topic t -channel c -n 200000 -max-in-flight 2500
//
// The clock starts before the connection is made and stops when the n-th message has
// been handled (go-nsq FINs it right after the handler returns).
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/nsqio/go-nsq"
)

func main() {
	addr := flag.String("nsqd", "127.0.0.1:4150", "nsqd TCP address")
	topic := flag.String("topic", "bench", "topic")
	channel := flag.String("channel", "bench", "channel")
	n := flag.Int64("n", 200000, "messages to consume")
	maxInFlight := flag.Int("max-in-flight", 2500, "max in flight")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()

	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	c, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatal(err)
	}
	c.SetLogger(log.New(io.Discard, "", 0), nsq.LogLevelError)
	var count int64
	done := make(chan struct{})
	c.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		if atomic.AddInt64(&count, 1) == *n {
			close(done)
		}
		return nil
	}))
	start := time.Now()
	if err := c.ConnectToNSQD(*addr); err != nil {
		log.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(*timeout):
		log.Printf("timeout after %d messages", atomic.LoadInt64(&count))
	}
	elapsed := time.Since(start).Seconds()
	got := atomic.LoadInt64(&count)
	c.Stop()
	<-c.StopChan
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
		"consumer": "go-nsq v1.1.0", "messages": got, "seconds": elapsed,
		"msg_per_s": float64(got) / elapsed,
	})
}
