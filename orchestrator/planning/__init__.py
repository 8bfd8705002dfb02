"""Before paying: prices, the plan, the estimate and forecast, probe work, and the pure deadline and zone
policies that the fleet and the simulator share. Plain functions of data; the store only read."""
