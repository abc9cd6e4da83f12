// A gRPC application written with grpc-java on Netty (Debian's
// libgrpc-java and libnetty-java, compiled with the system javac by
// scripts/fetch-peers.sh), for tests/it/peer_matrix.rs.
//
// It serves the bench protocol (proto/drainshim/bench/v1/stream.proto)
// without generated stubs: MethodDescriptors with byte-array marshallers,
// and the few protobuf fields it needs encoded by hand. The server is
// NettyServerBuilder with its defaults: grpc-java's keepalive enforcement
// (KeepAliveEnforcer: a PING less than 5 minutes after the previous one,
// with no DATA or HEADERS written in between, is a strike; past 2 strikes
// GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") and the connection closes).
//
//   Subscribe  a Tick (stream id, sequence number 1, 2, ...) every
//              interval_ms (100 ms when 0); `count` of them, or forever when 0.
//   Echo       answers with the request's body after delay_ms (3 s when 0).
//
// On SIGTERM, SIGINT, a line `stop` on stdin or stdin's end it stops
// gracefully: shutdown() (GOAWAY, no new calls), then awaitTermination for
// GRACE; what is left then is cancelled with shutdownNow(). Once the calls' last
// callbacks ran (how each call ended), it reports and exits 0.
//
// Stdout, one line each (the test waits on them):
//   listening 127.0.0.1:PORT
//   subscribe ID PEER      a Subscribe call started; PEER is the client's address
//   ended ID LAST HOW      a Subscribe call is over: the last sequence number
//                          handed to the transport, and how it ended
//   echo BODY              an Echo call started
//   stopping               the graceful stop began
//   report {json}          once stopped: per stream, last_written and ended

import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Grpc;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.ServerServiceDefinition;
import io.grpc.Status;
import io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.ServerCalls;
import io.grpc.stub.StreamObserver;

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

public final class StreamApp {
  static final String SERVICE = "drainshim.bench.v1.Stream";
  /** How long the calls in flight get after the stop began (grpc_app.py's too). */
  static final long GRACE_SECONDS = 20;

  /** Message bytes as they are: there is no generated code to parse them. */
  static final MethodDescriptor.Marshaller<byte[]> BYTES =
      new MethodDescriptor.Marshaller<byte[]>() {
        @Override
        public InputStream stream(byte[] value) {
          return new ByteArrayInputStream(value);
        }

        @Override
        public byte[] parse(InputStream in) {
          try {
            return in.readAllBytes();
          } catch (IOException e) {
            throw Status.INTERNAL.withDescription("read a message").withCause(e).asRuntimeException();
          }
        }
      };

  static final MethodDescriptor<byte[], byte[]> SUBSCRIBE =
      MethodDescriptor.newBuilder(BYTES, BYTES)
          .setType(MethodDescriptor.MethodType.SERVER_STREAMING)
          .setFullMethodName(MethodDescriptor.generateFullMethodName(SERVICE, "Subscribe"))
          .build();
  static final MethodDescriptor<byte[], byte[]> ECHO =
      MethodDescriptor.newBuilder(BYTES, BYTES)
          .setType(MethodDescriptor.MethodType.UNARY)
          .setFullMethodName(MethodDescriptor.generateFullMethodName(SERVICE, "Echo"))
          .build();

  /** The client's address, for the `subscribe` line. */
  static final Context.Key<SocketAddress> PEER = Context.key("peer");

  /** Every stream's ticks, on one thread: a call's writes never overlap. */
  static final ScheduledExecutorService TICKS = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "ticks");
    t.setDaemon(true);
    return t;
  });

  /** Per stream id: the last sequence number handed to the transport, and how it ended. */
  static final Map<String, Object[]> LEDGER = new TreeMap<>();

  static synchronized void say(String line) {
    System.out.print(line + "\n");
    System.out.flush();
  }

  static void record(String id, Long lastWritten, String ended) {
    synchronized (LEDGER) {
      Object[] e = LEDGER.computeIfAbsent(id, k -> new Object[] {0L, null});
      if (lastWritten != null) {
        e[0] = lastWritten;
      }
      if (ended != null) {
        e[1] = ended;
      }
    }
  }

  /** Varint (Long) and length-delimited (byte[]) fields by number. */
  static Map<Integer, Object> fields(byte[] b) {
    Map<Integer, Object> out = new HashMap<>();
    int[] at = {0};
    while (at[0] < b.length) {
      long key = varint(b, at);
      int number = (int) (key >>> 3);
      int wire = (int) (key & 7);
      switch (wire) {
        case 0:
          out.put(number, varint(b, at));
          break;
        case 2:
          int size = (int) varint(b, at);
          if (size < 0 || at[0] + size > b.length) {
            throw Status.INVALID_ARGUMENT.withDescription("truncated field").asRuntimeException();
          }
          byte[] v = new byte[size];
          System.arraycopy(b, at[0], v, 0, size);
          at[0] += size;
          out.put(number, v);
          break;
        case 1:
          at[0] += 8;
          break;
        case 5:
          at[0] += 4;
          break;
        default:
          throw Status.INVALID_ARGUMENT.withDescription("wire type " + wire).asRuntimeException();
      }
    }
    return out;
  }

  static long varint(byte[] b, int[] at) {
    long v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at[0] >= b.length) {
        throw Status.INVALID_ARGUMENT.withDescription("truncated varint").asRuntimeException();
      }
      int c = b[at[0]++] & 0xff;
      v |= (long) (c & 0x7f) << shift;
      if (c < 0x80) {
        return v;
      }
    }
    throw Status.INVALID_ARGUMENT.withDescription("varint too long").asRuntimeException();
  }

  static void putVarint(ByteArrayOutputStream out, long v) {
    while ((v & ~0x7fL) != 0) {
      out.write((int) ((v & 0x7f) | 0x80));
      v >>>= 7;
    }
    out.write((int) v);
  }

  static void putBytes(ByteArrayOutputStream out, int number, byte[] v) {
    putVarint(out, (long) number << 3 | 2);
    putVarint(out, v.length);
    out.write(v, 0, v.length);
  }

  static long longField(Map<Integer, Object> f, int number) {
    Object v = f.get(number);
    return v instanceof Long ? (Long) v : 0L;
  }

  static byte[] bytesField(Map<Integer, Object> f, int number) {
    Object v = f.get(number);
    return v instanceof byte[] ? (byte[]) v : new byte[0];
  }

  /** One Subscribe call: its ticks, and its end (said once). */
  static final class Subscription implements Runnable {
    final String id;
    final long count;
    final byte[] payload;
    final ServerCallStreamObserver<byte[]> out;
    long seq;
    boolean over;
    ScheduledFuture<?> ticking;

    Subscription(String id, long count, byte[] payload, ServerCallStreamObserver<byte[]> out) {
      this.id = id;
      this.count = count;
      this.payload = payload;
      this.out = out;
    }

    @Override
    public synchronized void run() {
      if (over) {
        return;
      }
      ByteArrayOutputStream tick = new ByteArrayOutputStream();
      putBytes(tick, 1, id.getBytes(StandardCharsets.UTF_8));
      putVarint(tick, 2 << 3);
      putVarint(tick, seq + 1);
      putBytes(tick, 3, payload);
      try {
        out.onNext(tick.toByteArray());
      } catch (RuntimeException e) {
        end("send failed: " + e);
        return;
      }
      // onNext returned: grpc-java's transport has it; from here only the
      // transport can lose it.
      seq++;
      record(id, seq, null);
      if (count != 0 && seq >= count) {
        out.onCompleted();
        end("OK");
      }
    }

    synchronized void end(String how) {
      if (over) {
        return;
      }
      over = true;
      if (ticking != null) {
        ticking.cancel(false);
      }
      record(id, null, how);
      say("ended " + id + " " + seq + " " + how);
    }
  }

  static void subscribe(byte[] request, StreamObserver<byte[]> observer) {
    Map<Integer, Object> f = fields(request);
    String id = new String(bytesField(f, 1), StandardCharsets.UTF_8);
    long interval = longField(f, 3);
    Subscription s =
        new Subscription(
            id,
            longField(f, 2),
            new byte[(int) longField(f, 4)],
            (ServerCallStreamObserver<byte[]>) observer);
    s.out.setOnCancelHandler(() -> s.end("cancelled"));
    record(id, null, null);
    say("subscribe " + id + " " + address(PEER.get()));
    synchronized (s) {
      s.ticking =
          TICKS.scheduleWithFixedDelay(s, 0, interval == 0 ? 100 : interval, TimeUnit.MILLISECONDS);
    }
  }

  static void echo(byte[] request, StreamObserver<byte[]> observer) {
    Map<Integer, Object> f = fields(request);
    byte[] body = bytesField(f, 1);
    long delay = longField(f, 2);
    say("echo " + new String(body, StandardCharsets.UTF_8));
    TICKS.schedule(
        () -> {
          ByteArrayOutputStream reply = new ByteArrayOutputStream();
          putBytes(reply, 1, body);
          observer.onNext(reply.toByteArray());
          observer.onCompleted();
        },
        delay == 0 ? 3000 : delay,
        TimeUnit.MILLISECONDS);
  }

  /** `127.0.0.1:PORT`, as the other apps print it (an InetSocketAddress says `/127.0.0.1:PORT`). */
  static String address(SocketAddress a) {
    if (a instanceof InetSocketAddress) {
      InetSocketAddress i = (InetSocketAddress) a;
      return i.getAddress().getHostAddress() + ":" + i.getPort();
    }
    return String.valueOf(a);
  }

  static String json(String s) {
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }

  public static void main(String[] args) throws Exception {
    ServerInterceptor peer =
        new ServerInterceptor() {
          @Override
          public <Q, R> ServerCall.Listener<Q> interceptCall(
              ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
            Context ctx =
                Context.current().withValue(PEER, call.getAttributes().get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR));
            return Contexts.interceptCall(ctx, call, headers, next);
          }
        };
    ServerServiceDefinition service =
        ServerServiceDefinition.builder(SERVICE)
            .addMethod(SUBSCRIBE, ServerCalls.asyncServerStreamingCall(StreamApp::subscribe))
            .addMethod(ECHO, ServerCalls.asyncUnaryCall(StreamApp::echo))
            .build();
    // The calls' callbacks run here (grpc-java's default is a cached pool
    // too), so the stop can wait for the last of them.
    ExecutorService calls = Executors.newCachedThreadPool();
    // Defaults only: grpc-java's keepalive enforcement included.
    Server server =
        NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0))
            .executor(calls)
            .addService(ServerInterceptors.intercept(service, peer))
            .build()
            .start();

    CountDownLatch stop = new CountDownLatch(1);
    for (String name : new String[] {"TERM", "INT"}) {
      sun.misc.Signal.handle(new sun.misc.Signal(name), sig -> stop.countDown());
    }
    Thread stdin =
        new Thread(
            () -> {
              try (BufferedReader in =
                  new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("stop")) {
                  // Only `stop` means anything.
                }
              } catch (IOException e) {
                // A broken stdin stops the server, as a closed one does.
              }
              stop.countDown();
            },
            "stdin");
    stdin.setDaemon(true);
    stdin.start();

    say("listening 127.0.0.1:" + server.getPort());
    stop.await();
    say("stopping");
    server.shutdown();
    if (!server.awaitTermination(GRACE_SECONDS, TimeUnit.SECONDS)) {
      server.shutdownNow();
      server.awaitTermination(5, TimeUnit.SECONDS);
    }
    // A terminated server may still have callbacks queued (a call's cancel
    // handler, which says how it ended): they run before the report, or the
    // exit would drop what they say.
    calls.shutdown();
    calls.awaitTermination(5, TimeUnit.SECONDS);
    StringBuilder report = new StringBuilder("{\"streams\": {");
    synchronized (LEDGER) {
      String sep = "";
      for (Map.Entry<String, Object[]> e : LEDGER.entrySet()) {
        Object ended = e.getValue()[1];
        report.append(sep).append(json(e.getKey())).append(": {\"last_written\": ")
            .append(e.getValue()[0]).append(", \"ended\": ")
            .append(ended == null ? "null" : json((String) ended)).append('}');
        sep = ", ";
      }
    }
    say("report " + report.append("}}"));
    System.exit(0);
  }
}
