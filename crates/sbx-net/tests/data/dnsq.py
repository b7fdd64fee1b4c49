# A tiny DNS client for the tests: dnsq.py SERVER QTYPE NAME... sends one
# query per name over UDP (all at once, then collects replies for up to 3 s)
# and prints "NAME RCODE ANCOUNT IP,IP..." or "NAME TIMEOUT" per name.
import random, socket, struct, sys, time

RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
QTYPES = {"A": 1, "TXT": 16, "AAAA": 28, "NULL": 10, "ANY": 255, "PTR": 12}

def query(qid, name, qtype):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack("!HH", qtype, 1)

def skip_name(b, i):
    while True:
        l = b[i]
        if l == 0:
            return i + 1
        if l & 0xC0 == 0xC0:
            return i + 2
        i += 1 + l

def answers(b):
    qd, an = struct.unpack("!HH", b[4:8])
    i = 12
    for _ in range(qd):
        i = skip_name(b, i) + 4
    ips = []
    for _ in range(an):
        i = skip_name(b, i)
        t, _c, _ttl, l = struct.unpack("!HHIH", b[i:i + 10])
        i += 10
        if t == 1 and l == 4:
            ips.append(socket.inet_ntop(socket.AF_INET, b[i:i + 4]))
        elif t == 28 and l == 16:
            ips.append(socket.inet_ntop(socket.AF_INET6, b[i:i + 16]))
        i += l
    return an, ips

server, qtype, names = sys.argv[1], QTYPES[sys.argv[2]], sys.argv[3:]
fam = socket.AF_INET6 if ":" in server else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
ids = {}
for n in names:
    qid = random.randrange(65536)
    while qid in ids:
        qid = random.randrange(65536)
    ids[qid] = n
    s.sendto(query(qid, n, qtype), (server, 53))
    time.sleep(0.002)
res = {}
import os
end = time.time() + float(os.environ.get("DNSQ_WAIT", "3"))
while len(res) < len(ids) and time.time() < end:
    s.settimeout(max(0.01, end - time.time()))
    try:
        b, _ = s.recvfrom(4096)
    except socket.timeout:
        break
    qid = struct.unpack("!H", b[:2])[0]
    if qid in ids and qid not in res:
        an, ips = answers(b)
        res[qid] = "%s %s %d %s" % (ids[qid], RCODES.get(b[3] & 15, b[3] & 15), an, ",".join(ips) or "-")
for qid, n in ids.items():
    print(res.get(qid, "%s TIMEOUT" % n))
