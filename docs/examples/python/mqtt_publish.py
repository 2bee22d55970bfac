#!/usr/bin/env python3
"""Publish a few readings to Hourglass through an MQTT broker, at QoS 1.

    MQTT_URL   the broker Hourglass subscribes to (default mqtt://localhost:1883;
               mqtt://user:password@host:port when it wants a login)
    sensor     the first argument, else HOURGLASS_SENSOR (default demo-1)

Needs paho-mqtt (pip install paho-mqtt; 1.6 or 2.x). Prints each topic and
payload once the broker acknowledged it; exits 1 on any error.
"""

import json
import os
import sys
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import paho.mqtt.client as mqtt

BROKER = urlparse(os.environ.get("MQTT_URL", "mqtt://localhost:1883"))
SENSOR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HOURGLASS_SENSOR", "demo-1")
METRIC = "temp"
# sensors/{sensor}/{metric} takes a bare number (stamped on receipt) or
# {"value": …, "ts": …}; sensors/{sensor} takes reading objects as over HTTP.
TOPIC = f"sensors/{SENSOR}/{METRIC}"

# paho-mqtt 2 asks which callback API to use; 1.x has no such argument.
if hasattr(mqtt, "CallbackAPIVersion"):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
else:
    client = mqtt.Client()
if BROKER.username:
    client.username_pw_set(BROKER.username, BROKER.password)
if BROKER.scheme == "mqtts":
    client.tls_set()  # the system's CA certificates
port = BROKER.port or (8883 if BROKER.scheme == "mqtts" else 1883)
client.connect(BROKER.hostname or "localhost", port)  # raises when unreachable
client.loop_start()  # a background thread sends and receives from here on

try:
    # Three readings ten seconds apart, the last one now, in whole seconds.
    now = datetime.now(timezone.utc).replace(microsecond=0)
    for i, value in enumerate([18.25, 18.5, 19.0]):
        ts = (now - timedelta(seconds=10 * (2 - i))).strftime("%Y-%m-%dT%H:%M:%SZ")
        payload = json.dumps({"value": value, "ts": ts})
        # QoS 1: the broker acknowledges the message once it holds it, and
        # Hourglass's own session receives it at least once (stored once).
        message = client.publish(TOPIC, payload, qos=1)
        message.wait_for_publish(timeout=10)
        if not message.is_published():
            sys.exit(f"the broker did not acknowledge {TOPIC} within 10 s")
        print("published", TOPIC, payload)
finally:
    client.disconnect()  # a clean DISCONNECT, then the thread stops
    client.loop_stop()
