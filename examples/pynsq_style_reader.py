"""A pynsq program, unchanged except for its import line.

With pynsq it would start ``import nsq``; here ``import nsq_spark as nsq`` runs the very
same code on nsq_spark's Reader. It prints every message body of TOPIC twice, through two
channels: ``print`` answers synchronously (return True), ``async`` answers later from a
callback (``message.enable_async()``). Stop it with Ctrl-C or SIGTERM: nsq_spark then
closes cleanly (every message answered, CLS sent) before ``nsq.run()`` returns.

    TOPIC=events LOOKUPD=127.0.0.1:4161 python examples/pynsq_style_reader.py
"""

import os
import sys

import tornado.ioloop

import nsq_spark as nsq  # with pynsq: import nsq


def print_handler(message):
    sys.stdout.write("print:%s\n" % message.body.decode())
    sys.stdout.flush()
    return True


def async_handler(message):
    message.enable_async()

    def later():
        sys.stdout.write("async:%s\n" % message.body.decode())
        sys.stdout.flush()
        message.finish()
    tornado.ioloop.IOLoop.current().add_callback(later)


class CarefulReader(nsq.Reader):
    def giving_up(self, message):
        sys.stderr.write("giving up on %s after %d attempts\n" % (message.id, message.attempts))


def main():
    topic = os.environ.get("TOPIC", "pynsq_example")
    lookupd = os.environ.get("LOOKUPD", "127.0.0.1:4161").split(",")
    CarefulReader(topic=topic, channel="print", message_handler=print_handler,
                  lookupd_http_addresses=lookupd, max_in_flight=9, max_tries=3,
                  lookupd_poll_interval=1, lookupd_poll_jitter=0.1)
    r = nsq.Reader(topic=topic, channel="async", lookupd_http_addresses=lookupd,
                   max_in_flight=20, lookupd_poll_interval=1, heartbeat_interval=5)
    r.set_message_handler(async_handler)
    sys.stderr.write("ready\n")
    nsq.run()
    sys.stderr.write("stopped cleanly\n")


if __name__ == "__main__":
    main()
