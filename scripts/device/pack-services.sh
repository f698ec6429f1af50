#!/usr/bin/env bash
# Packs RabbitMQ (with Erlang) and PostgreSQL 15 from Debian's packages into .e2e/services.tar.xz
# (~50 MB) for scripts/device/e2e.sh, and the stripped binary into .e2e/voxbatch.xz. The GPU
# machine has no network: carry .e2e (ignored by git; add `/.e2e/` to .git/info/exclude).
# Run after `cargo build`.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .e2e/debs
cd .e2e/debs
apt-get update -qq
apt-get download rabbitmq-server erlang-base erlang-asn1 erlang-crypto erlang-eldap erlang-inets erlang-mnesia \
  erlang-os-mon erlang-parsetools erlang-public-key erlang-runtime-tools erlang-ssl erlang-syntax-tools \
  erlang-tools erlang-xmerl postgresql-15 libpq5 libicu72 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libxml2 \
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libpam0g libaudit1 libcap-ng0 \
  liblz4-1 libzstd1 libtinfo6 libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libidn2-0 libunistring2 \
  libtasn1-6 libffi8 libgcrypt20 libgpg-error0 libcap2 liblzma5 libsystemd0
cd ..
rm -rf stage && mkdir -p stage/sys stage/lib
for f in debs/*.deb; do
  case $(basename "$f") in rabbitmq-server*|erlang-*) dpkg -x "$f" stage/sys ;; *) dpkg -x "$f" stage/lib ;; esac
done
rm -rf stage/*/usr/share/doc stage/*/usr/share/man stage/*/usr/share/locale stage/lib/usr/lib/postgresql/15/lib/bitcode
( cd stage/lib/usr/lib/postgresql/15/bin && rm -f pg_upgrade pgbench pg_waldump pg_rewind pg_receivewal pg_recvlogical \
  pg_basebackup pg_checksums pg_amcheck pg_verifybackup pg_test_fsync pg_test_timing pg_archivecleanup pg_resetwal \
  pg_dumpall pg_dump pg_restore vacuumlo oid2name )
tar -C stage -cJf services.tar.xz sys lib
rm -rf stage debs
strip -o voxbatch ../target/debug/voxbatch && xz -T2 -6 -f voxbatch
ls -la services.tar.xz voxbatch.xz
