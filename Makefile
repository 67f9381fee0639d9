# The reference guide's targets, each a thin wrapper over cargo, systemctl or kubectl.
#   make kunpeng-tap-build                      build the agent (release)
#   make kunpeng-tap-install-service-docker     install binary + Docker proxy unit
#   make kunpeng-tap-install-service-containerd install binary + CRI proxy unit
#   make kunpeng-tap-install-service            the same for RUNTIME=docker|containerd (docker)
#   make kunpeng-tap-start-service              enable and start it
#   make kunpeng-tap-uninstall-service          stop, disable, remove unit and binary
#   make kunpeng-tap-nri-deploy / -undeploy     NRI mode DaemonSet via the Helm chart (or kubectl, NRI_MANIFEST=...)
#   make release                                dist/: chart package, both images (amd64+arm64 OCI archives), SHA256SUMS

CARGO       ?= cargo
SYSTEMCTL   ?= systemctl
KUBECTL     ?= kubectl
INSTALL     ?= install
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
UNITDIR     ?= /etc/systemd/system
RUNTIME     ?= docker
SERVICE     := kunpeng-tap.service
BIN         := target/release/kunpeng-tap
UNIT_SRC    := hack/kunpeng-tap
HELM        ?= helm
NAMESPACE   ?= kunpeng-tap
# NRI mode is deployed with the Helm chart; set NRI_MANIFEST to apply a rendered manifest with
# kubectl instead (e.g. from `helm template`).
NRI_MANIFEST ?=

.PHONY: kunpeng-tap-build kunpeng-tap-install-service kunpeng-tap-install-service-docker \
	kunpeng-tap-install-service-containerd kunpeng-tap-start-service \
	kunpeng-tap-uninstall-service uninstall-service kunpeng-tap-nri-deploy kunpeng-tap-nri-undeploy \
	test test-unit test-e2e release

kunpeng-tap-build:
	$(CARGO) build --release -p node-agent --bin kunpeng-tap

kunpeng-tap-install-service: kunpeng-tap-install-service-$(RUNTIME)

kunpeng-tap-install-service-docker kunpeng-tap-install-service-containerd: kunpeng-tap-install-service-%: kunpeng-tap-build
	@test -f $(UNIT_SRC)/kunpeng-tap.service.$* || { echo "no unit for runtime '$*' (docker or containerd)"; exit 2; }
	$(INSTALL) -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/kunpeng-tap
	$(INSTALL) -D -m 0644 $(UNIT_SRC)/kunpeng-tap.service.$* $(DESTDIR)$(UNITDIR)/$(SERVICE)
	$(SYSTEMCTL) daemon-reload

kunpeng-tap-start-service:
	$(SYSTEMCTL) enable --now $(SERVICE)
	$(SYSTEMCTL) --no-pager status $(SERVICE)

kunpeng-tap-uninstall-service:
	-$(SYSTEMCTL) disable --now $(SERVICE)
	rm -f $(DESTDIR)$(UNITDIR)/$(SERVICE) $(DESTDIR)$(BINDIR)/kunpeng-tap
	$(SYSTEMCTL) daemon-reload

uninstall-service: kunpeng-tap-uninstall-service

kunpeng-tap-nri-deploy:
ifeq ($(NRI_MANIFEST),)
	$(HELM) upgrade --install kunpeng-tap charts/kunpeng-tap --namespace $(NAMESPACE) --create-namespace $(HELM_ARGS)
else
	$(KUBECTL) apply -f $(NRI_MANIFEST)
endif

kunpeng-tap-nri-undeploy:
ifeq ($(NRI_MANIFEST),)
	$(HELM) uninstall kunpeng-tap --namespace $(NAMESPACE)
else
	$(KUBECTL) delete --ignore-not-found -f $(NRI_MANIFEST)
endif

test: test-unit test-e2e
test-unit:
	bash hack/test.sh unit
test-e2e:
	bash hack/test.sh e2e

# hack/release.sh says what it needs and writes; dist/ is not tracked.
release:
	bash hack/release.sh
