package dev.outbox.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * The registry's list of run-time-editable settings, empty.
 *
 * <p>Apicurio builds this list with a Quarkus extension whose build-time half
 * (apicurio-common-app-components-config-index-deployment) is not on Maven Central, so the pom
 * leaves the extension out and this bean stands in for it: the tests never edit the registry's
 * settings through its admin API, and everything else works as released.
 */
@ApplicationScoped
public class NoDynamicConfig {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(java.util.List.of());
    }
}
