"""RabbitMQ throughput with voxbatch's queue shape (issue 18, docs/SCALING.md): a durable quorum
queue with x-delivery-limit, persistent ~300-byte job messages published with publisher confirms
(a window of unconfirmed messages, as `voxbatch enqueue` keeps), then consumed with a per-consumer
prefetch and one ack per message (as workers ack after each commit).

    .venv/bin/python tools/bench_broker.py [--url amqp://…] [--messages 50000] [--consumers 2]

Prints a JSON line: publishes/s and deliveries/s. Declares and deletes its own queue.
"""
import argparse
import json
import threading
import time
import uuid

import pika


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=192)
    a = ap.parse_args()
    queue = f"vbt-broker-bench-{uuid.uuid4().hex[:8]}"
    params = pika.URLParameters(a.url)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5})
    ch.confirm_delivery()
    body = json.dumps({"job_id": str(uuid.uuid4()), "text": "x" * 220, "campaign": "bench", "voice": "default"}).encode()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
    t0 = time.perf_counter()
    for _ in range(a.messages):
        # BlockingConnection with confirms waits for each confirm: a window of one. voxbatch keeps
        # a window; this is the pessimistic single-publisher rate.
        ch.basic_publish("", queue, body, props)
    publish_s = time.perf_counter() - t0
    conn.close()

    done = [0]
    lock = threading.Lock()
    t1 = time.perf_counter()

    def consume():
        c = pika.BlockingConnection(params)
        cch = c.channel()
        cch.basic_qos(prefetch_count=a.prefetch)
        for method, _props, _body in cch.consume(queue, inactivity_timeout=2):
            if method is None:
                break
            cch.basic_ack(method.delivery_tag)
            with lock:
                done[0] += 1
        c.close()

    threads = [threading.Thread(target=consume) for _ in range(a.consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    consume_s = time.perf_counter() - t1 - 2.0  # minus the idle timeout that ended each consumer
    conn = pika.BlockingConnection(params)
    conn.channel().queue_delete(queue)
    conn.close()
    print(json.dumps({"url": params.host + ":" + str(params.port), "messages": a.messages, "consumers": a.consumers,
                      "prefetch": a.prefetch, "publish_per_s": round(a.messages / publish_s),
                      "delivered": done[0], "deliver_ack_per_s": round(done[0] / consume_s)}))


if __name__ == "__main__":
    main()
