#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the study executor's test (tests/test_study_slurm.py):
# Debian's slurm-wlm and munge, a slurm.conf for this host, then munged, slurmctld and slurmd.
# Idempotent: what is installed, written or running already is kept. Needs root (CI runs as root);
# without root or apt it says so and exits 0, and the SLURM test skips with that reason.
set -uo pipefail

if [ "$(id -u)" -ne 0 ]; then echo "slurm.sh: not root, no SLURM cluster started"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { echo "slurm.sh: no apt-get, no SLURM cluster started"; exit 0; }
  apt-get install -y -q slurm-wlm munge >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; } \
    || { echo "slurm.sh: could not install slurm-wlm and munge"; exit 0; }
fi

host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
conf=/etc/slurm/slurm.conf
if ! grep -qs "^NodeName=$host " $conf; then
  cat > $conf <<CONF
# One-node cluster of kdcollapse's .ci/slurm.sh (rewritten when the host name changes).
ClusterName=kdcollapse
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
fi
[ -f /etc/slurm/cgroup.conf ] || echo "CgroupPlugin=autodetect" > /etc/slurm/cgroup.conf

if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 30); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then
    echo "slurm.sh: one-node cluster up ($host, $cpus CPUs)"; exit 0
  fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1
  sleep 1
done
echo "slurm.sh: the cluster did not come up; see /var/log/slurm/"; sinfo 2>&1 | head -5
exit 0
