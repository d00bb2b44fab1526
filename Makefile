# dm-tiercache top-level Makefile.
#
#   make              build dm-tiercache/dm-tiercache.ko for KVER
#   make C=1 W=1      the same, with sparse and extra warnings
#   make test         the whole test suite (installs what it needs, boots QEMU)
#   make experiment   the flush-linearisation experiment (installs what it needs)

KVER ?= $(shell ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1)
KDIR ?= /lib/modules/$(KVER)/build

.PHONY: all module clean test test-host experiment userspace

all: module

module:
	$(MAKE) -C $(KDIR) M=$(CURDIR)/dm-tiercache modules

userspace:
	$(MAKE) -C userspace

test-host:
	$(MAKE) -C tests/host check

test:
	./tests/run.sh

experiment:
	./scripts/experiment.sh

clean:
	-$(MAKE) -C $(KDIR) M=$(CURDIR)/dm-tiercache clean
	-$(MAKE) -C tests/host clean
