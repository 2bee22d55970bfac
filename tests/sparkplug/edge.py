"""Sparkplug B edge nodes, simulated with pysparkplug (Eclipse-style
payloads and topics, encoded by a library not written here), against the
broker Hourglass subscribes to.

    edge.py <broker host> <port> <scenario> <json args>

Prints one JSON line: what was published that Hourglass must store
(`expected`: [sensor, metric, epoch second, value]) and what this side saw
(rebirth commands, STATE messages, dead letters).
"""

import json
import random
import sys
import threading
import time

import paho.mqtt.client as paho
import pysparkplug as spb
from pysparkplug import DataType, Metric

GROUP = "plant"


class Watcher:
    """Records NCMD, STATE and dead-letter messages."""

    def __init__(self, host, port, dead_topic):
        self.ncmd, self.state, self.dead = [], [], []
        self.lock = threading.Lock()
        self.c = paho.Client(client_id="watcher-%d" % time.time_ns(), clean_session=True)
        self.c.on_message = self.on_message
        self.subscribed = threading.Event()
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.c.connect(host, port)
        self.c.loop_start()
        self.c.subscribe([("spBv1.0/%s/NCMD/#" % GROUP, 1), ("spBv1.0/STATE/#", 1), (dead_topic, 1)])
        self.subscribed.wait(10)

    def on_message(self, _c, _u, m):
        with self.lock:
            if "/NCMD/" in m.topic:
                p = spb.NCmd.decode(m.payload)
                self.ncmd.append({"topic": m.topic, "metrics": [[x.name, x.value] for x in p.metrics]})
            elif "/STATE/" in m.topic:
                self.state.append({"topic": m.topic, "retain": bool(m.retain), "payload": json.loads(m.payload)})
            else:
                self.dead.append(json.loads(m.payload))

    def stop(self):
        self.c.loop_stop()
        self.c.disconnect()


def edge(host, port, node, bd):
    """An edge node's connection, its Will an NDEATH with `bd`."""
    c = spb.Client(client_id="edge-%s-%d" % (node, time.time_ns()))
    will = spb.Message(
        topic=spb.Topic(message_type=spb.MessageType.NDEATH, group_id=GROUP, edge_node_id=node),
        payload=spb.NDeath(timestamp=spb.get_current_timestamp(), bd_seq_metric=Metric(
            timestamp=spb.get_current_timestamp(), name="bdSeq", datatype=DataType.INT64, value=bd)),
        qos=spb.QoS.AT_LEAST_ONCE, retain=False)
    c.set_will(will)
    c.connect(host, port=port, blocking=False)
    time.sleep(0.5)
    return c


def send(c, kind, payload, node, device=None, qos=spb.QoS.AT_LEAST_ONCE):
    topic = spb.Topic(message_type=kind, group_id=GROUP, edge_node_id=node, device_id=device)
    c.publish(spb.Message(topic=topic, payload=payload, qos=qos, retain=False), include_dtypes=True)


def m(name, alias, dt, value, ts, **kw):
    return Metric(timestamp=ts, name=name, alias=alias, datatype=dt, value=value, **kw)


# The node's metrics: (name, alias, datatype, birth value, data value).
NODE = [
    ("Inputs/i8", 1, DataType.INT8, -1, -128),
    ("Inputs/i16", 2, DataType.INT16, -300, 32767),
    ("Inputs/i32", 3, DataType.INT32, -70000, -2147483648),
    ("Inputs/i64", 4, DataType.INT64, -5000000000000, 9007199254740993),
    ("Inputs/u8", 5, DataType.UINT8, 200, 255),
    ("Inputs/u16", 6, DataType.UINT16, 65535, 1),
    ("Inputs/u32", 7, DataType.UINT32, 4294967295, 0),
    ("Inputs/u64", 8, DataType.UINT64, 18014398509481984, 7),
    ("Outputs/float", 9, DataType.FLOAT, 1.5, -0.25),
    ("Outputs/double", 10, DataType.DOUBLE, 21.125, -3.5),
    ("Outputs/on", 11, DataType.BOOLEAN, True, False),
]
DEVICE = [
    ("rpm", 100, DataType.UINT16, 1200, 1500),
    ("temp C", 101, DataType.DOUBLE, 80.5, 81.25),
]


def metric_name(name):
    return "".join("__" if ch == "/" else ch if (ch.isascii() and (ch.isalnum() or ch in "_-")) else "_" for ch in name)


def number(v):
    return float(v) if not isinstance(v, bool) else (1.0 if v else 0.0)


def scenario_plant(host, port, args):
    w = Watcher(host, port, args["dead_topic"])
    t0 = args["t0_ms"]
    expected = []
    gw = edge(host, port, "gw1", 0)

    # NBIRTH: every numeric datatype with an alias, a string, bdSeq, Node Control.
    birth = [m(n, a, dt, b, t0) for n, a, dt, b, _ in NODE]
    birth += [m("serial", 20, DataType.STRING, "SN-1", t0),
              m("Properties/Location", None, DataType.STRING, "Hall 3", t0),
              m("bdSeq", None, DataType.INT64, 0, t0),
              m("Node Control/Rebirth", 21, DataType.BOOLEAN, False, t0)]
    send(gw, spb.MessageType.NBIRTH, spb.NBirth(timestamp=t0, seq=0, metrics=tuple(birth)), "gw1")
    expected += [["gw1", metric_name(n), t0 // 1000, number(b)] for n, _, _, b, _ in NODE]
    send(gw, spb.MessageType.DBIRTH, spb.DBirth(timestamp=t0, seq=1, metrics=tuple(
        m(n, a, dt, b, t0) for n, a, dt, b, _ in DEVICE)), "gw1", "press")
    expected += [["gw1.press", metric_name(n), t0 // 1000, number(b)] for n, _, _, b, _ in DEVICE]

    # NDATA by alias only, one second later; a null, a transient, a
    # historical value an hour back.
    t1 = t0 + 1000
    data = [m(None, a, dt, v, t1) for _, a, dt, _, v in NODE]
    data += [m(None, 10, DataType.DOUBLE, None, t1 + 1000, is_null=True),
             m(None, 9, DataType.FLOAT, 99.0, t1 + 1000, is_transient=True),
             m(None, 10, DataType.DOUBLE, 7.75, t0 - 3_600_000, is_historical=True)]
    send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t1, seq=2, metrics=tuple(data)), "gw1")
    expected += [["gw1", metric_name(n), t1 // 1000, number(v)] for n, _, _, _, v in NODE]
    expected.append(["gw1", metric_name("Outputs/double"), (t0 - 3_600_000) // 1000, 7.75])
    send(gw, spb.MessageType.DDATA, spb.DData(timestamp=t1, seq=3, metrics=tuple(
        m(None, a, dt, v, t1) for _, a, dt, _, v in DEVICE)), "gw1", "press")
    expected += [["gw1.press", metric_name(n), t1 // 1000, number(v)] for n, _, _, _, v in DEVICE]

    # A gap: seq 4 never comes. Stored anyway; a rebirth is asked for after
    # the reorder timeout.
    t2 = t0 + 2000
    send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t2, seq=5, metrics=(m(None, 10, DataType.DOUBLE, 1.0, t2),)), "gw1")
    expected.append(["gw1", metric_name("Outputs/double"), t2 // 1000, 1.0])
    deadline = time.time() + 30
    while not w.ncmd and time.time() < deadline:
        time.sleep(0.1)
    seen_gap_rebirth = len(w.ncmd)

    # An unknown alias, and data from a node never born: dead-lettered; the
    # first is within the cooldown (no second request), the second asks gw2.
    send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t2, seq=6, metrics=(m(None, 999, DataType.DOUBLE, 5.0, t2),)), "gw1")
    other = spb.Client(client_id="edge-gw2-%d" % time.time_ns())
    other.connect(host, port=port, blocking=False)
    time.sleep(0.3)
    send(other, spb.MessageType.NDATA, spb.NData(timestamp=t2, seq=1, metrics=(m(None, 1, DataType.DOUBLE, 5.0, t2),)), "gw2")

    # The node answers the rebirth in a new session (bdSeq 1): its old
    # connection drops without a DISCONNECT, so the broker sends its Will
    # (bdSeq 0) first, then the new birth.
    gw._client.loop_stop()
    gw._client.socket().close()
    time.sleep(1.5)
    gw = edge(host, port, "gw1", 1)
    t3 = t0 + 3000
    send(gw, spb.MessageType.NBIRTH, spb.NBirth(timestamp=t3, seq=0, metrics=(
        m("bdSeq", None, DataType.INT64, 1, t3), m("Outputs/double", 10, DataType.DOUBLE, 2.0, t3))), "gw1")
    expected.append(["gw1", metric_name("Outputs/double"), t3 // 1000, 2.0])
    send(gw, spb.MessageType.DBIRTH, spb.DBirth(timestamp=t3, seq=1, metrics=tuple(
        m(n, a, dt, b, t3) for n, a, dt, b, _ in DEVICE)), "gw1", "press")
    expected += [["gw1.press", metric_name(n), t3 // 1000, number(b)] for n, _, _, b, _ in DEVICE]
    # A stale NDEATH (bdSeq 0) arriving late: ignored, gw1 stays online.
    send(gw, spb.MessageType.NDEATH, spb.NDeath(timestamp=t3, bd_seq_metric=m("bdSeq", None, DataType.INT64, 0, t3)), "gw1")
    # The device dies.
    send(gw, spb.MessageType.DDEATH, spb.DDeath(timestamp=t3, seq=2), "gw1", "press")

    deadline = time.time() + 30
    while len(w.dead) < 2 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    # Clean disconnects: no Will, so the states above are the last word.
    gw.disconnect()
    other.disconnect()
    w.stop()
    return {"expected": expected, "ncmd": w.ncmd, "gap_rebirths": seen_gap_rebirth, "state": w.state,
            "dead": w.dead, "next_seq": 3, "bd": 1}


def scenario_offline(host, port, args):
    """While Hourglass is down: gw1 goes on publishing by alias (QoS 1, so the
    broker keeps them in Hourglass's session)."""
    t0 = args["t0_ms"]
    gw = spb.Client(client_id="edge-gw1-late-%d" % time.time_ns())
    gw.connect(host, port=port, blocking=False)
    time.sleep(0.5)
    expected = []
    seq = args["seq"]
    for k in range(5):
        t = t0 + 10_000 + k * 1000
        send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t, seq=seq % 256, metrics=(m(None, 10, DataType.DOUBLE, 10.0 + k, t),)), "gw1")
        expected.append(["gw1", metric_name("Outputs/double"), t // 1000, 10.0 + k])
        seq += 1
    time.sleep(0.5)
    gw.disconnect()
    return {"expected": expected}


def scenario_stream(host, port, args):
    """A birth, then one value a message by alias (QoS 1), at a steady pace."""
    t0, n, pause = args["t0_ms"], args["n"], 1.0 / args["rate"]
    gw = edge(host, port, "gw9", 0)
    send(gw, spb.MessageType.NBIRTH, spb.NBirth(timestamp=t0, seq=0, metrics=(
        m("bdSeq", None, DataType.INT64, 0, t0), m("flow", 1, DataType.FLOAT, 0.5, t0))), "gw9")
    expected = [["gw9", "flow", t0 // 1000, 0.5]]
    for k in range(1, n + 1):
        t = t0 + k * 1000
        v = float(k % 97) - 40.0
        send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t, seq=k % 256, metrics=(m(None, 1, DataType.FLOAT, v, t),)), "gw9")
        expected.append(["gw9", "flow", t // 1000, v])
        time.sleep(pause)
    time.sleep(0.5)
    gw.disconnect()
    return {"expected": expected}


def scenario_exception(host, port, args):
    """An edge node reporting a valve by exception: the valve is sampled every
    second over `seconds`, holding for hours and moving for minutes, and its
    value is published (NDATA by alias, QoS 1) only when it has moved past
    the deadband from the last value published."""
    t0, seconds, deadband = args["t0_s"], args["seconds"], args["deadband"]
    rng = random.Random(args["seed"])
    gw = edge(host, port, "gw5", 0)
    v = sent = 50.0
    send(gw, spb.MessageType.NBIRTH, spb.NBirth(timestamp=t0 * 1000, seq=0, metrics=(
        m("bdSeq", None, DataType.INT64, 0, t0 * 1000), m("valve", 1, DataType.DOUBLE, v, t0 * 1000))), "gw5")
    expected = [["gw5", "valve", t0, v]]
    seq, change = 1, 0
    moving = False
    for s in range(1, seconds):
        if s >= change:
            moving = not moving
            change = s + (rng.randint(300, 1800) if moving else rng.randint(3600, 4 * 3600))
        if moving:
            v = min(100.0, max(0.0, v + rng.gauss(0, 0.6)))
        if abs(v - sent) > deadband:
            sent = round(v, 3)
            t = (t0 + s) * 1000
            send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t, seq=seq % 256, metrics=(
                m(None, 1, DataType.DOUBLE, sent, t),)), "gw5")
            expected.append(["gw5", "valve", t0 + s, sent])
            seq += 1
            if seq % 100 == 0:
                time.sleep(0.05)
    time.sleep(0.5)
    gw.disconnect()
    return {"expected": expected}


def scenario_crowd(host, port, args):
    """Edge nodes born one after another, each with one value, then a
    device birth per node: more than the host is set to keep."""
    w = Watcher(host, port, args["dead_topic"])
    t0, nodes, devices = args["t0_ms"], args["nodes"], args["devices"]
    expected, clients = [], []
    for i, node in enumerate(nodes):
        gw = edge(host, port, node, 0)
        clients.append(gw)
        t = t0 + i * 1000
        send(gw, spb.MessageType.NBIRTH, spb.NBirth(timestamp=t, seq=0, metrics=(
            m("bdSeq", None, DataType.INT64, 0, t), m("flow", 1, DataType.FLOAT, float(i), t))), node)
        send(gw, spb.MessageType.NDATA, spb.NData(timestamp=t + 30_000, seq=1, metrics=(
            m(None, 1, DataType.FLOAT, float(i) + 0.5, t + 30_000),)), node)
        expected += [[node, "flow", t // 1000, float(i)], [node, "flow", (t + 30_000) // 1000, float(i) + 0.5]]
        # In order: the host sees births in the order they are sent.
        time.sleep(0.3)
    for k, device in enumerate(devices):
        t = t0 + 60_000 + k * 1000
        send(clients[0], spb.MessageType.DBIRTH, spb.DBirth(timestamp=t, seq=2 + k, metrics=(
            m("rpm", 100, DataType.UINT16, 1000 + k, t),)), nodes[0], device)
        expected.append(["%s.%s" % (nodes[0], device), "rpm", t // 1000, float(1000 + k)])
        time.sleep(0.3)
    deadline = time.time() + 30
    while len(w.dead) < args["dead"] and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    for gw in clients:
        gw.disconnect()
    w.stop()
    return {"expected": expected, "ncmd": w.ncmd, "dead": w.dead}


def main():
    host, port, scenario, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    out = {"plant": scenario_plant, "offline": scenario_offline, "stream": scenario_stream,
           "exception": scenario_exception, "crowd": scenario_crowd}[scenario](host, port, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
