# Thin wrappers over the scripts (they hold the logic and the docs).
#   make install [PREFIX=/usr/local] [DESTDIR=/stage] [BIN_DIR=target/release]
#   make uninstall [PREFIX=...] [DESTDIR=...]
#   make package   (a .deb and a static tarball in target/package)
.PHONY: install uninstall package

install:
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" scripts/install $(if $(BIN_DIR),--bin-dir "$(BIN_DIR)")

uninstall:
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" scripts/install --uninstall

package:
	scripts/package
