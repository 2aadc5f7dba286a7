#!/usr/bin/env bash
# Fetches Apicurio Registry 3.3.3 (the Schema Registry the tests run) from
# Maven Central: `mvn dependency:copy-dependencies` over
# tests/registry/pom.xml copies its runnable archive into the modstream
# cache, where it is unpacked. Apicurio 3.3 needs Java 21+: the script
# finds one (JAVA_HOME, `java` on the PATH, or /usr/lib/jvm/*) and writes
# its path to `java` beside quarkus-run.jar. Reruns are instant. Prints
# the folder holding quarkus-run.jar on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
dest="$cache/apicurio-3.3.3"
stamp="$dest/.pom-$(sha256sum tests/registry/pom.xml | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$(cat "$dest/java" 2>/dev/null)" ]; then echo "$dest"; exit 0; fi
major_of() { "$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p'; }
java=""
for candidate in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
  [ -n "$candidate" ] && [ -x "$candidate" ] || continue
  if [ "$(major_of "$candidate")" -ge 21 ] 2>/dev/null; then java=$candidate; break; fi
done
[ -n "$java" ] || { echo "fetch-apicurio: Apicurio Registry 3.3 needs Java 21+; none found (JAVA_HOME, PATH, /usr/lib/jvm)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "fetch-apicurio: mvn not found; install Maven (Debian: maven)" >&2; exit 1; }
echo "fetch-apicurio: collecting Apicurio Registry 3.3.3 from Maven Central (first run only)" >&2
rm -rf "$dest.partial"; mkdir -p "$dest.partial"
if ! mvn -B -q -f tests/registry/pom.xml -Dmaven.repo.local="$cache/maven-repo" \
     dependency:copy-dependencies -DoutputDirectory="$dest.partial/archive" >&2; then
  echo "fetch-apicurio: mvn could not fetch io.apicurio:apicurio-registry-app:3.3.3 (see above); the Schema Registry tests need it" >&2
  exit 1
fi
tar xzf "$dest.partial"/archive/apicurio-registry-app-3.3.3-all.tar.gz -C "$dest.partial"
rm -rf "$dest.partial/archive"
[ -f "$dest.partial/quarkus-run.jar" ] || { echo "fetch-apicurio: quarkus-run.jar missing from the archive" >&2; exit 1; }
echo "$java" > "$dest.partial/java"
rm -rf "$dest"; mv "$dest.partial" "$dest"
touch "$stamp"
echo "$dest"
