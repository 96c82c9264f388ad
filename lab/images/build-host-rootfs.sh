#!/usr/bin/env bash
# STAND-IN (lab only): builds the rootfs tarball of a simulated L4 host (a systemd "machine" in a podman
# container), the stand-in for a real Debian GPU server. Recipe proven in /work/shared/notes/test-infra.md
# section 2, plus openssh-server, sudo and the user `fleet` (passwordless sudo). podman is NOT installed:
# the production roles install it.
#
# usage: build-host-rootfs.sh SUITE ARCHIVE_URI SECURITY_URI OUT_TARBALL
# The URIs come from this machine's own apt sources (no host name is hard-coded here).
set -euo pipefail
SUITE=$1 MIRROR=$2 SECURITY=$3 OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${OUT%/*}/.rootfs-$SUITE.XXXXXX")
R=$WORK/rootfs
trap 'rm -rf "$WORK"' EXIT
export DEBIAN_FRONTEND=noninteractive

# mmdebstrap (one apt run, parallel downloads, dpkg without fsync while it builds): about 2.4x less CPU than debootstrap
# for this rootfs (52 s -> 22 s of CPU, 2026-12-02); minbase = Essential + apt as debootstrap's, and the same packages
# (maybe-merged-usr: usr-is-merged as debootstrap, not usrmerge + perl). force-unsafe-io is for the build only (below).
mmdebstrap --quiet --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-apt,iproute2,ca-certificates,procps,curl,sudo,openssh-server \
  --hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr --dpkgopt=force-unsafe-io \
  "$SUITE" "$R" "$MIRROR"
rm -f "$R/etc/dpkg/dpkg.cfg.d/99mmdebstrap"  # the lab host's dpkg syncs as a real server's does

cat > "$R/etc/apt/sources.list" <<EOS
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOS
: > "$R/etc/machine-id"                    # systemd generates one at boot
rm -f "$R/var/lib/dbus/machine-id"
# Units that fail in a container (modules-load: no kmod), race a converge for the dpkg lock (apt-daily*),
# or are useless here.
for u in systemd-modules-load.service apt-daily.timer apt-daily-upgrade.timer apt-daily.service \
         apt-daily-upgrade.service dpkg-db-backup.timer fstrim.timer getty@tty1.service \
         systemd-pstore.service; do
  ln -sf /dev/null "$R/etc/systemd/system/$u"
done
rm -f "$R/etc/systemd/system/timers.target.wants/"* "$R/etc/systemd/system/getty.target.wants/"*
printf 'path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-include /usr/share/doc/*/copyright\n' \
  > "$R/etc/dpkg/dpkg.cfg.d/01-nodoc"

# sshd: every host gets its own host keys at first boot (the image must not share them).
rm -f "$R"/etc/ssh/ssh_host_*
install -m 0644 "$HERE/lab-ssh-keygen.service" "$R/etc/systemd/system/lab-ssh-keygen.service"
mkdir -p "$R/etc/systemd/system/multi-user.target.wants"
ln -sf ../lab-ssh-keygen.service "$R/etc/systemd/system/multi-user.target.wants/lab-ssh-keygen.service"
install -m 0644 "$HERE/sshd-lab.conf" "$R/etc/ssh/sshd_config.d/50-d3-lab.conf"

# Debian 12 only: podman's cgroup manager for the nested lab (why: containers-cgroupfs.conf). podman is installed
# later by the production roles; its configuration directory is read whenever it runs.
if [ "$SUITE" = bookworm ]; then
  install -D -m 0644 "$HERE/containers-cgroupfs.conf" "$R/etc/containers/containers.conf.d/50-d3-lab-cgroupfs.conf"
fi

# The fleet's admin user: key login, passwordless sudo (as on a real fleet).
chroot "$R" useradd --create-home --shell /bin/bash --user-group fleet
install -d -m 0700 -o "$(chroot "$R" id -u fleet)" -g "$(chroot "$R" id -g fleet)" "$R/home/fleet/.ssh"
printf 'fleet ALL=(ALL) NOPASSWD:ALL\n' > "$R/etc/sudoers.d/90-fleet"
chmod 0440 "$R/etc/sudoers.d/90-fleet"

chroot "$R" apt-get clean
rm -rf "$R/var/lib/apt/lists/"* "$R/var/cache/apt/"*.bin "$R/var/log/"*.log
# Empty apt lists must look stale, or apt(cache_valid_time=...) skips the update.
mkdir -p "$R/var/lib/apt/lists/partial"
touch -d @0 "$R/var/lib/apt/lists" "$R/var/lib/apt/lists/partial"

tar --numeric-owner --xattrs -C "$R" -cf "$WORK/rootfs.tar" .
mv "$WORK/rootfs.tar" "$OUT"
