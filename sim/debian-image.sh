# shellcheck shell=bash
# debian-image.sh -- images of Debian packages: a debootstrap minbase with the packages, checked,
# trimmed and tarred, for `docker import`. Sourced by sim/sim (the sim's Prometheus, door and
# keepalived images, pushed to its registry) and by scripts/build-keepalived-image (keepalived
# for an operator's registry), so both build keepalived the same way.
#
# The caller sets IMG_CACHE (rootfs tarballs and the .deb cache), LOGS (build.log), SUITE,
# MIRROR and IMAGE_RECORD (the file inside the image that records its inputs), and defines
# log and die.

sha() { sha256sum | cut -c1-64; }

umount_under() { # dir: unmount every mount point at or below dir (deepest first)
  local d m
  d=$(readlink -f "$1" 2>/dev/null) || return 0
  awk '{print $5}' /proc/self/mountinfo | sed 's/\\040/ /g' | { grep -E "^$d(/|$)" || true; } |
    sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
safe_rm() { # rm -rf a tree that may have had mounts in it
  local d
  for d in "$@"; do
    [ -e "$d" ] || continue
    umount_under "$d"
    rm -rf --one-file-system "$d"
  done
}
drop_others() { # files... -- keep : delete older stage tarballs
  local f keep=${*: -1}
  for f in "$@"; do
    [ "$f" = -- ] && break
    [ "$f" != "$keep" ] && [ -f "$f" ] && rm -f "$f"
  done
  return 0
}

# Each image is cached by its inputs' key: bump an image's build version when its fix-up or
# import changes.
image_key() { printf '%s|%s|%s|%s|%s\n' "$1" "$2" "$SUITE" "$MIRROR" "$3" | sha; } # NAME VERSION PACKAGES
debian_rootfs() { # NAME KEY PACKAGES FIXUP -> rootfs tarball path on stdout
  # FIXUP WORK completes the tree and checks it; a failure says what is missing on stderr.
  local name=$1 key=$2 packages=$3 fixup=$4 out work try
  out="$IMG_CACHE/$name-${key:0:16}.tar"
  if [ ! -s "$out" ]; then
    work="$IMG_CACHE/work-$name"
    safe_rm "$work"
    mkdir -p "$IMG_CACHE/debs" "$LOGS"
    log "debootstrap $SUITE (minbase + $packages) ..."
    for try in 1 2 3; do
      debootstrap --variant=minbase --include="$packages" --cache-dir="$IMG_CACHE/debs" \
        "$SUITE" "$work" "$MIRROR" >>"$LOGS/build.log" 2>&1 && break
      safe_rm "$work"
      [ $try = 3 ] && die "debootstrap ($name) failed 3 times (see $LOGS/build.log)"
      log "debootstrap failed, retrying"; sleep 5
    done
    umount_under "$work"
    if ! "$fixup" "$work"; then safe_rm "$work"; die "the $name image's rootfs is incomplete"; fi
    rm -rf "$work"/usr/share/doc/* "$work"/usr/share/man/* "$work"/usr/share/info/* \
      "$work"/var/cache/apt/* "$work"/var/lib/apt/lists/* "$work"/var/log/*.log "$work"/tmp/*
    : >"$work/etc/resolv.conf"
    printf '%s\n' "inputs=$key" "debian=$SUITE" "packages=$packages" >"$work$IMAGE_RECORD"
    tar -C "$work" --numeric-owner --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' \
      -cf "$out.tmp" . && mv "$out.tmp" "$out"
    safe_rm "$work"
    drop_others "$IMG_CACHE/$name"-*.tar -- "$out"
  fi
  echo "$out"
}
has_executables() { # ROOT PATH...: each PATH executable under ROOT, else say which is not
  local root=$1 path
  shift
  for path in "$@"; do
    [ -x "$root$path" ] || { echo "$path missing from the image's rootfs" >&2; return 1; }
  done
}

# keepalived (bookworm: 2.2.7) for the door's virtual IP on two nodes (router.door.virtualIp;
# docs/vrrp-trial.md). The program runs it through bash (assets/virtual-ip.sh: keepalived and
# the door's check loop) and checks its config with `--entrypoint keepalived ... -t`; the
# entrypoint here is keepalived in the foreground for anyone running the image by hand.
# shellcheck disable=SC2034  # used by sim/sim and scripts/build-keepalived-image
KEEPALIVED_BUILD_VERSION=1
KEEPALIVED_DEB_INCLUDE="keepalived"
keepalived_fixup() { has_executables "$1" /usr/sbin/keepalived /bin/bash; }
# shellcheck disable=SC2034
KEEPALIVED_IMAGE_CHANGES=(
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  'ENTRYPOINT ["/usr/sbin/keepalived", "-n", "-l", "-D", "-f"]'
  'CMD ["/etc/keepalived/keepalived.conf"]')
keepalived_key() { image_key keepalived "$KEEPALIVED_BUILD_VERSION" "$KEEPALIVED_DEB_INCLUDE"; }
