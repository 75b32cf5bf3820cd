"""A real SMTP server (aiosmtpd) on loopback for the e-mail tests: prints `READY <port>`,
then one JSON line per message received (envelope and the raw message)."""
import asyncio
import json
import socket
import sys

from aiosmtpd.controller import Controller


class Record:
    async def handle_DATA(self, server, session, envelope):
        print(json.dumps({
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "data": envelope.content.decode("utf-8", "replace"),
        }), flush=True)
        return "250 Message accepted for delivery"


def main():
    # aiosmtpd's start-up check connects to the port it was given, so it needs a real one.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = Controller(Record(), hostname="127.0.0.1", port=port)
    c.start()
    print(f"READY {port}", flush=True)
    try:
        sys.stdin.read()
    finally:
        c.stop()


if __name__ == "__main__":
    main()
