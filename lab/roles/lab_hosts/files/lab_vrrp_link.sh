#!/bin/sh
# STAND-IN (lab only): the lab routers' shared network, where VRRP (keepalived) works. The routers keep their
# slirp4netns network (the machine's loopback as 10.0.2.2: the instances' published ports, the lab services); this adds
# a second link, a veth pair from a bridge on this machine into the router container's network namespace (the
# containers are privileged: NET_ADMIN for keepalived's virtual address). The machine reaches the routers' addresses
# and the virtual address through the bridge. Idempotent: prints "created" or "present". A container that was stopped
# and started again lost its link: run this again (make lab does).
# Usage: lab_vrrp_link.sh BRIDGE BRIDGE_ADDRESS/PREFIX CONTAINER ADDRESS/PREFIX HOST_SIDE_NAME
set -eu
bridge=$1 bridge_addr=$2 container=$3 addr=$4 host_if=$5
if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
fi
ip address replace "$bridge_addr" dev "$bridge"
ip link set "$bridge" up
pid=$(podman inspect --format '{{.State.Pid}}' "$container")
[ "$pid" -gt 0 ] || { echo "$container is not running" >&2; exit 1; }
if nsenter -t "$pid" -n ip link show vrrp0 >/dev/null 2>&1; then
    echo present
    exit 0
fi
# a host side left from the container's previous run (its peer went with the old namespace) is removed first
ip link del "$host_if" 2>/dev/null || true
ip link add "$host_if" type veth peer name "$host_if-c"
ip link set "$host_if" master "$bridge" up
ip link set "$host_if-c" netns "$pid"
nsenter -t "$pid" -n ip link set "$host_if-c" name vrrp0
nsenter -t "$pid" -n ip address add "$addr" dev vrrp0
nsenter -t "$pid" -n ip link set vrrp0 up
echo created
