#!/bin/sh
# Is FILE signed by the key whose fingerprint is FINGERPRINT?
#
#   gpuplat-verify-signature FILE SIGNATURE KEYFILE FINGERPRINT
#
# The key file is imported into a keyring of its own (nothing in root's keyring is trusted or touched),
# and the signature must be a good one made by the primary key FINGERPRINT: a key file that holds
# another key, or a signature by any other key, is refused, as is a file changed after it was signed and a
# signature by the key where the key file says it is revoked.
# Exit 0 when it is; 1 with one line on stderr saying what is wrong otherwise; 2 on bad usage.
set -u

if [ "$#" -ne 4 ]; then
    echo "usage: gpuplat-verify-signature FILE SIGNATURE KEYFILE FINGERPRINT" >&2
    exit 2
fi
file=$1 signature=$2 keyfile=$3
expected=$(printf '%s' "$4" | tr -d ' ' | tr 'a-f' 'A-F')

home=$(mktemp -d) || exit 1
trap 'rm -rf "$home"' EXIT
export GNUPGHOME="$home"

if ! gpg --batch --quiet --import "$keyfile" 2>"$home/import.err"; then
    echo "$file: the key file $keyfile could not be imported: $(tr '\n' ' ' <"$home/import.err")" >&2
    exit 1
fi
# fpr records of primary keys (the line after each pub record), field 10 (GnuPG doc/DETAILS).
primaries=$(gpg --batch --with-colons --fingerprint 2>/dev/null | awk -F: '$1 == "pub" {p = 1; next} $1 == "fpr" && p {print $10; p = 0}')
case " $(echo "$primaries" | tr '\n' ' ') " in
    *" $expected "*) ;;
    *)
        echo "$file: the key file $keyfile holds key $(echo "$primaries" | tr '\n' ' ')not $expected: not the publisher's key" >&2
        exit 1
        ;;
esac
# VALIDSIG's last field is the primary key's fingerprint (GnuPG doc/DETAILS); a good signature by a
# subkey of the expected key names it there too.
status=$(gpg --batch --status-fd 1 --verify "$signature" "$file" 2>/dev/null)
signer=$(echo "$status" | awk '$2 == "VALIDSIG" {print $NF}')
if [ -z "$signer" ]; then
    echo "$file: the signature $signature does not verify (the file was changed or is not the one signed); refusing it" >&2
    exit 1
fi
if [ "$signer" != "$expected" ]; then
    echo "$file: signed by key $signer, not by $expected; refusing it" >&2
    exit 1
fi
# A good signature by a revoked key still gets VALIDSIG, beside REVKEYSIG (GnuPG doc/DETAILS): the
# publisher revoked it (a key it lost, say), so what it signed is no proof.
if echo "$status" | awk '$2 == "REVKEYSIG" {found = 1} END {exit !found}'; then
    echo "$file: signed by key $expected, which the key file $keyfile says is revoked; refusing it" >&2
    exit 1
fi
