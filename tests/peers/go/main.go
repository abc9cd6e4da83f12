// A gRPC application written with grpc-go (Debian's golang-google-grpc-dev,
// built in GOPATH mode by scripts/fetch-peers.sh), for tests/it/peer_matrix.rs.
//
// It serves the bench protocol (proto/drainshim/bench/v1/stream.proto)
// without generated stubs: a hand-written grpc.ServiceDesc, a codec that
// passes message bytes through, and the few protobuf fields it needs encoded
// by hand. The server is grpc.NewServer() with no options: grpc-go's default
// keepalive enforcement (a PING less than 5 minutes after the previous one,
// with no DATA or HEADERS written in between, is a strike; the third strike
// is GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") and the connection closes).
//
//	Subscribe  a Tick (stream id, sequence number 1, 2, ...) every
//	           interval_ms (100 ms when 0); `count` of them, or forever when 0.
//	Echo       answers with the request's body after delay_ms (3 s when 0).
//
// On SIGTERM, SIGINT, a line `stop` on stdin or stdin's end it stops
// gracefully with GracefulStop(): GOAWAY, no new calls, and it waits for the
// calls in flight; after GRACE it gives up and Stop()s. Then it exits 0.
//
// Stdout, one line each (the test waits on them):
//
//	listening 127.0.0.1:PORT
//	subscribe ID PEER      a Subscribe call started; PEER is the client's address
//	ended ID LAST HOW      a Subscribe call is over: the last sequence number
//	                       handed to the transport, and how it ended
//	echo BODY              an Echo call started
//	stopping               the graceful stop began
//	report {json}          once stopped: per stream, last_written and ended
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const (
	service = "drainshim.bench.v1.Stream"
	// How long the calls in flight get after the stop began (grpc_app.py's too).
	grace = 20 * time.Second
)

// message is the bytes of one protobuf message, encoded or decoded by hand.
type message struct{ b []byte }

// rawCodec hands message bytes to the transport as they are. Registered as
// "proto", the codec of content-type application/grpc, in place of the
// protobuf one (there is no generated code to give it).
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(*message)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return m.b, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(*message)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	m.b = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func init() { encoding.RegisterCodec(rawCodec{}) }

var sayMu sync.Mutex

// say writes one line to stdout at once: the handlers run concurrently.
func say(format string, args ...interface{}) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// ledger: per stream id, the last sequence number handed to the transport
// and how the call ended.
type entry struct {
	LastWritten uint64  `json:"last_written"`
	Ended       *string `json:"ended"`
}

var (
	ledgerMu sync.Mutex
	ledger   = map[string]*entry{}
)

func record(id string, update func(e *entry)) {
	ledgerMu.Lock()
	defer ledgerMu.Unlock()
	e, ok := ledger[id]
	if !ok {
		e = &entry{}
		ledger[id] = e
	}
	update(e)
}

// fields decodes varint (uint64) and length-delimited ([]byte) fields by number.
func fields(b []byte) (map[int]uint64, map[int][]byte, error) {
	ints, bytes := map[int]uint64{}, map[int][]byte{}
	for i := 0; i < len(b); {
		key, n := varint(b[i:])
		if n == 0 {
			return nil, nil, errors.New("truncated key")
		}
		i += n
		num, wire := int(key>>3), key&7
		switch wire {
		case 0:
			v, n := varint(b[i:])
			if n == 0 {
				return nil, nil, errors.New("truncated varint")
			}
			ints[num], i = v, i+n
		case 2:
			size, n := varint(b[i:])
			if n == 0 || uint64(len(b)-i-n) < size {
				return nil, nil, errors.New("truncated field")
			}
			i += n
			bytes[num], i = b[i:i+int(size)], i+int(size)
		case 1:
			i += 8
		case 5:
			i += 4
		default:
			return nil, nil, fmt.Errorf("wire type %d", wire)
		}
	}
	return ints, bytes, nil
}

// varint reads one; n is 0 when b ends first.
func varint(b []byte) (v uint64, n int) {
	for shift := uint(0); n < len(b) && shift < 64; shift += 7 {
		c := b[n]
		n++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, n
		}
	}
	return 0, 0
}

func putVarint(out []byte, v uint64) []byte {
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

func putBytes(out []byte, num int, v []byte) []byte {
	out = putVarint(out, uint64(num)<<3|2)
	out = putVarint(out, uint64(len(v)))
	return append(out, v...)
}

func putUint(out []byte, num int, v uint64) []byte {
	return putVarint(putVarint(out, uint64(num)<<3), v)
}

func subscribe(_ interface{}, stream grpc.ServerStream) error {
	var req message
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	ints, bytes, err := fields(req.b)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "SubscribeRequest: %v", err)
	}
	id := string(bytes[1])
	count := ints[2]
	interval := time.Duration(ints[3]) * time.Millisecond
	if interval == 0 {
		interval = 100 * time.Millisecond
	}
	payload := make([]byte, ints[4])
	from := "unknown"
	if p, ok := peer.FromContext(stream.Context()); ok {
		from = p.Addr.String()
	}
	record(id, func(*entry) {})
	say("subscribe %s %s", id, from)
	var last uint64
	how := "OK"
	defer func() {
		record(id, func(e *entry) { e.Ended = &how })
		say("ended %s %d %s", id, last, how)
	}()
	ticker := time.NewTimer(0)
	defer ticker.Stop()
	for seq := uint64(1); count == 0 || seq <= count; seq++ {
		select {
		case <-stream.Context().Done():
			how = "cancelled"
			return stream.Context().Err()
		case <-ticker.C:
		}
		tick := putBytes(nil, 1, []byte(id))
		tick = putUint(tick, 2, seq)
		tick = putBytes(tick, 3, payload)
		if err := stream.SendMsg(&message{b: tick}); err != nil {
			how = "send failed: " + err.Error()
			return err
		}
		// SendMsg returned: grpc-go's transport has it; from here only
		// the transport can lose it.
		last = seq
		record(id, func(e *entry) { e.LastWritten = seq })
		ticker.Reset(interval)
	}
	return nil
}

func echo(_ interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
	var req message
	if err := dec(&req); err != nil {
		return nil, err
	}
	ints, bytes, err := fields(req.b)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "EchoRequest: %v", err)
	}
	say("echo %s", bytes[1])
	delay := time.Duration(ints[2]) * time.Millisecond
	if delay == 0 {
		delay = 3 * time.Second
	}
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &message{b: putBytes(nil, 1, bytes[1])}, nil
}

var desc = grpc.ServiceDesc{
	ServiceName: service,
	// Any value implements interface{}: there is no generated interface.
	HandlerType: (*interface{})(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Echo", Handler: echo}},
	Streams: []grpc.StreamDesc{
		{StreamName: "Subscribe", Handler: subscribe, ServerStreams: true},
	},
}

func main() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(69)
	}
	// No options: grpc-go's defaults, keepalive enforcement included.
	server := grpc.NewServer()
	server.RegisterService(&desc, struct{}{})

	stop := make(chan struct{})
	var once sync.Once
	stopNow := func() { once.Do(func() { close(stop) }) }
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		stopNow()
	}()
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "stop" {
				break
			}
		}
		// A closed stdin (the test is gone) stops the server too.
		stopNow()
	}()

	served := make(chan error, 1)
	go func() { served <- server.Serve(lis) }()
	say("listening %s", lis.Addr())
	select {
	case <-stop:
	case err := <-served:
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(70)
	}
	say("stopping")
	graceful := make(chan struct{})
	go func() {
		server.GracefulStop()
		close(graceful)
	}()
	select {
	case <-graceful:
	case <-time.After(grace):
		server.Stop()
		<-graceful
	}
	ledgerMu.Lock()
	report, _ := json.Marshal(map[string]interface{}{"streams": ledger})
	ledgerMu.Unlock()
	say("report %s", report)
}
